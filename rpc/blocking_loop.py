"""The background loop of :mod:`rpc.blocking`: one per process, run by a daemon thread,
started by the first blocking call and again after its thread ends (a handler a blocking
client serves raised SystemExit or KeyboardInterrupt, which leave ``run_forever``) or in a
child made by ``os.fork()`` (the thread does not come along). The thread's exit closes the
connections made on its loop, then the loop, and fails what waits on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from typing import Any

from rpc import loops
from rpc.blocking_buffer import Buffer
from rpc.errors import ConnectionClosed
from rpc.peer import Peer
from rpc.reconnect import ReconnectingPeer

FORKED = (
    "this blocking client was made before os.fork(): its connection is the parent's;"
    " connect again in this process"
)

GONE = (
    "this blocking client's loop is gone: a handler the process's blocking clients served"
    " ended the loop's thread (SystemExit, KeyboardInterrupt); connect again"
)

SETTLE = 1.0
"""Seconds the exit of the loop's thread runs the loop after cancelling its tasks and
cutting its connections, for them to end and their sockets to close (asyncio's
``loop.close()`` leaves transports' sockets open); what has not ended by then is left."""


def lost(home: asyncio.AbstractEventLoop) -> ConnectionClosed:
    """The error of a call on an object made on ``home``, a loop no thread runs here: one
    whose thread ended (closed then, or closing: :attr:`Background.ending`), or the
    parent's (forked since)."""
    current = _current
    gone = home.is_closed() or (current is not None and current.loop is home)
    return ConnectionClosed(GONE if gone else FORKED)


class Call:
    """The outcome of one blocking call, handed from the loop's thread to the caller's. Set
    once, on the loop's thread only (by its task's end, or by the end of that thread); then
    ``done``, a raw lock taken from the start, is released. The caller waits with
    ``done.acquire()``, one C call: an interrupt (KeyboardInterrupt) cannot leave a lock
    taken there, as one at the return of a Python ``__enter__`` can
    (``concurrent.futures.Future.result``'s ``with self._condition``, which left the
    future's lock held, and the loop's thread waiting for it for good as it set the result).
    ``cancelled``: set by an interrupted caller (the task is then not made, or cancelled)."""

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.settled = False
        self.cancelled = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.task: asyncio.Future[Any] | None = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        """On the loop's thread: the outcome, unless there is one already."""
        if self.settled:
            return
        self.settled = True
        self.result, self.error = result, error
        self.done.release()

    def cancel(self) -> None:
        """On the loop's thread: an interrupted caller's cancel of the task, if made."""
        if self.task is not None:
            self.task.cancel()

    def wait(self) -> Any:
        """In the caller's thread: the result once settled, or raise its error."""
        self.done.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class Background:
    """The shared loop, the thread that runs it, and what waits on it from other threads:
    the :class:`Call` of each call handed to it (dropped once done), the buffers of the streams
    made on it and the clients made on it (both weakly: each goes with its owner). Should
    the thread end, its exit fails the buffers, cancels the loop's tasks and cuts the
    clients' connections, runs the loop up to :data:`SETTLE` s so that they end, closes it,
    and fails the calls left with ConnectionClosed (:attr:`ending` tells a call woken by the
    cancel so); the next call starts another loop. The thread is compared as an object: a
    dead thread's ident is given to the next one."""

    def __init__(self) -> None:
        self.loop = loops.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name="peerwire-loop", daemon=True)
        self.calls: set[Call] = set()
        self.buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self.peers: weakref.WeakSet[ReconnectingPeer | Peer] = weakref.WeakSet()
        self.ending = False

    def _serve(self) -> None:
        try:
            self.loop.run_forever()
        finally:  # left by a BaseException: nothing runs this loop again
            self._end()

    def _end(self) -> None:
        global _current
        with _lock:  # from here no call or stream is handed to this loop
            self.ending = True
            try:
                for buffer in list(self.buffers):  # before their pumps' cancel ends them
                    buffer.finish(ConnectionClosed(GONE), drop=True)
                self._settle()
            finally:
                try:
                    self.loop.close()  # an object made on it sees a closed loop (lost)
                finally:
                    if _current is self:
                        _current = None
                    calls = list(self.calls)
        for call in calls:  # those not ended by the cancel (settled ones stay as they are)
            call.settle(error=ConnectionClosed(GONE))

    def _settle(self) -> None:
        """Cancel the loop's tasks and cut the connections of the clients made on it (no
        linger: nothing runs the loop later), then run it until they end, for
        :data:`SETTLE` s at most, as ``asyncio.run`` does after a KeyboardInterrupt. On the
        loop's thread, under the lock (re-entrant): a blocking call there raises
        CalledOnLoopThread as usual."""
        loop = self.loop
        pending: set[asyncio.Future[Any]] = set(asyncio.all_tasks(loop))
        for task in pending:
            task.cancel()
        for peer in list(self.peers):
            connection = peer.connection if isinstance(peer, ReconnectingPeer) else peer
            if connection is not None and connection.transport is not None:
                connection.transport.abort()
                pending.add(connection.closed)
        deadline = time.monotonic() + SETTLE
        while pending and (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(BaseException):  # another handler's SystemExit, say
                loop.run_until_complete(asyncio.wait(pending, timeout=left))
            pending = {future for future in pending if not future.done()}


_lock = threading.RLock()
"""Held while a call is handed to the loop, and by the exit of its thread (which may run
code that makes a blocking call: re-entrant)."""

_current: Background | None = None
"""The loop of this process, while its thread runs it."""


def lock() -> threading.RLock:
    """The lock held while a call is handed to the loop (:func:`background`); take it with
    ``with lock():`` in the caller, whose C-level acquire and release an interrupt
    (KeyboardInterrupt) cannot come between, as it could at a Python ``__enter__``'s return
    with the lock taken (it was a generator context manager: a Ctrl-C there left it held, and
    every later blocking call of the process, the loop's own ``connect()`` too, waited for
    good)."""
    return _lock


def background(buffer: Buffer | None = None) -> Background:
    """Under :func:`lock`: the background loop, started if none runs; nothing hands it calls
    or ends it meanwhile. ``buffer``: a stream's, failed should the loop's thread end."""
    global _current
    if _current is None:
        started = Background()
        try:
            started.thread.start()
        except BaseException:  # no thread to run it (RuntimeError: can't start new thread)
            started.loop.close()
            raise
        _current = started
    if buffer is not None:
        _current.buffers.add(buffer)
    return _current


def track(peer: ReconnectingPeer | Peer) -> asyncio.AbstractEventLoop:
    """Note ``peer``, made on the background loop, as one whose connection the exit of the
    loop's thread cuts; the loop."""
    with lock():
        current = background()
        current.peers.add(peer)
        return current.loop


def live_loop() -> asyncio.AbstractEventLoop | None:
    """The loop that runs now, if any: objects made on another are the parent's (forked)
    or their loop is gone, or going (its thread's exit closes their connections)."""
    current = _current
    return None if current is None or current.ending else current.loop


def on_loop_thread() -> bool:
    current = _current
    return current is not None and threading.current_thread() is current.thread


def _forget_loop() -> None:
    """In a child made by ``os.fork()``: the parent's loop has no thread here (a call handed
    to it waited for good), and the lock may have been held by another thread of the
    parent; the child's first call starts a loop of its own."""
    global _current, _lock
    _lock = threading.RLock()
    _current = None


os.register_at_fork(after_in_child=_forget_loop)

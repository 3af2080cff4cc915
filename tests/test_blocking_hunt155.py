"""Defects found in the blocking client (rpc.blocking) as it is used in production: each test
fails on the code it was written against, and is bounded in time."""

from __future__ import annotations

import itertools
import sys
import threading
import time
import warnings
from types import CodeType, FrameType
from typing import Any

import pytest

import rpc
import rpc.blocking
import rpc.blocking_loop
from tests.test_blocking_stream import Feeds, serving

# An interrupt the tests raise inside a garbage collector's weakref callback is ignored by
# Python (reported as unraisable), as a real Ctrl-C there would be: the test goes on to the
# next point. Not a failure of the code under test.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class Interrupter:
    """A trace function for this thread that raises KeyboardInterrupt once, at the ``n``-th
    start or return of a Python function called (at any depth) by a run of ``code``, where
    a signal's handler may run too; ``fired``: it came (``where``: in which function)."""

    def __init__(self, code: CodeType, n: int) -> None:
        self.code, self.n = code, n
        self.events = itertools.count(1)
        self.under = False
        self.fired = False

    def __call__(self, frame: FrameType, kind: str, arg: Any) -> Any:
        frame.f_trace_lines = False
        if frame.f_code is self.code:
            self.under = True
            return self.leave
        return self.event(frame, kind, arg) if self.under else None

    def leave(self, frame: FrameType, kind: str, arg: Any) -> Any:
        self.under = kind != "return"
        return self.leave

    def event(self, frame: FrameType, kind: str, arg: Any) -> Any:
        if kind in ("call", "return") and next(self.events) == self.n:
            self.fired = True
            self.where = (frame.f_code.co_filename.split("/")[-1], frame.f_code.co_name, kind)
            raise KeyboardInterrupt
        return self.event


def lock_free() -> bool:
    """rpc.blocking_loop's lock can be taken by another thread (the loop's, say) within 2 s."""
    took: list[bool] = []

    def take() -> None:
        if rpc.blocking_loop._lock.acquire(timeout=2):
            rpc.blocking_loop._lock.release()
            took.append(True)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(5)
    return took == [True]


@pytest.mark.parametrize("call", ["request", "stream"])
def test_an_interrupt_anywhere_in_a_call_cancels_it_or_sends_nothing(call: str) -> None:
    """A KeyboardInterrupt (Ctrl-C) at each point of a blocking request, or of stream()
    waiting for its first result, where a signal's handler may run, in turn, until the call
    runs to its end (its 0.2-s timeout): either the call never reached the server, or its
    handler is cancelled; the lock of rpc.blocking_loop is free, and a coroutine made is
    awaited (no "never awaited" warning). Before, one that came as the call was handed to
    the loop (in or just after ``run_coroutine_threadsafe``) left the request running in
    the background, out of anyone's reach, and one as ``held()`` (a generator context
    manager) returned the lock left it held: every later blocking call of the process
    waited for good (a connect at once: its loop-side ``track`` takes it)."""
    feeds = Feeds()
    method = getattr(rpc.blocking.BlockingPeer, call)
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        for n in itertools.count(1):
            name = str(n)
            started, ended = feeds.expect(name)
            interrupter = Interrupter(method.__code__, n)
            previous = sys.gettrace()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sys.settrace(interrupter)
                try:
                    getattr(peer, call)("hang", value=name, timeout=0.2)
                except KeyboardInterrupt:
                    pass
                except rpc.RpcError:  # not interrupted (or in a callback, which swallows it)
                    pass
                finally:
                    sys.settrace(previous)
                assert lock_free(), f"point {n}: the loop's lock is left held"
                # sent after it (the loop runs calls in order): its handler started by now
                assert peer.request("echo", name) == name
                if started.is_set():
                    assert ended.wait(5), f"point {n}: the interrupted call goes on"
            assert not [str(w.message) for w in caught], f"point {n}"
            if not interrupter.fired:  # the call ran to its end: every point was tried
                break


@pytest.mark.parametrize("reconnect", [False, True])
def test_close_takes_a_drain_timeout_for_calls_in_flight(reconnect: bool) -> None:
    """``close(drain_timeout=0.2)`` while another thread waits on a request the server never
    answers returns within about that (the caller gets ConnectionClosed), as the async
    peers' close does. Before, BlockingPeer.close took no drain_timeout (TypeError): a
    script shutting down with a call in flight waited the whole default 5 s."""
    feeds = Feeds()
    started, ended = feeds.expect("held")
    failed: list[BaseException] = []
    with serving(feeds.registry) as url:
        peer = rpc.blocking.connect(url, reconnect=reconnect)

        def call() -> None:
            try:
                peer.request("hang", "held", timeout=30)
            except BaseException as exc:
                failed.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert started.wait(5)
        begun = time.monotonic()
        peer.close(drain_timeout=0.2)
        assert time.monotonic() - begun < 2.5, "close waited for the call"
        caller.join(5)
        assert [type(exc) for exc in failed] == [rpc.ConnectionClosed]
        assert ended.wait(5)


def test_a_close_interrupted_anywhere_can_be_done_again() -> None:
    """A KeyboardInterrupt at each point of a stream's close() where a signal's handler may
    run, in turn: a close() made again (or the stream's drop) then stops the server's
    handler. Before, one that came once close() had taken the pump off the stream but before
    its cancel was handed to the loop left a pump nobody could cancel: a later close() and
    the stream's drop found none, and the handler of an endless stream ran for the
    connection's life."""
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        for n in itertools.count(1):
            name = f"close-{n}"
            _, ended = feeds.expect(name)
            results = peer.stream("feed", value=name, item_timeout=30)
            assert next(results) == 0
            interrupter = Interrupter(rpc.blocking.BlockingStream.close.__code__, n)
            previous = sys.gettrace()
            sys.settrace(interrupter)
            try:
                results.close()
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(previous)
            results.close()
            assert ended.wait(5), (
                f"point {n}: the stream's handler still runs {getattr(interrupter, 'where', None)}"
            )
            if not interrupter.fired:  # close() ran to its end: every point was tried
                break

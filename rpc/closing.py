"""Closing a connection: at once (:meth:`Closing.abort`) or gracefully (:meth:`Closing.close`),
and the linger that bounds both against a peer that does not read. Mixed into
:class:`~rpc.peer.Peer`, which sets up the attributes below."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from rpc.deadlines import Deadlines
from rpc.errors import CLOSING, ConnectionClosed, RetryLater
from rpc.logs import cuts
from rpc.outbox import Outbox

if TYPE_CHECKING:
    from rpc.backlog import Backlog
    from rpc.handler_runner import HandlerRunner
    from rpc.stream_hold import StreamHold
    from rpc.streaming import ResultWait
    from rpc.tasks import TaskSet

LINGER = 5.0
"""Seconds a connection we closed may take to hand over the bytes still queued for it (a
protocol's last word, the answers of a graceful close) and to finish its closing handshake
(the peer's TLS close_notify, its WebSocket close frame) before it is cut: a peer that does
not read or answer would otherwise keep it open, and its ``close()`` waiting, for good or
for the transport's own bound (WebSocket's ``close_timeout``, 10 s)."""

QUIET = 0.5
"""Seconds a TCP peer's input may pause after the FIN of a graceful close that turned its
input away (:meth:`Closing._end`) before the connection closes without its FIN: one that
does not close on our EOF is not waited for until the :data:`LINGER`, and what one still
sends is read (and dropped) rather than left unread to reset the connection."""

NOT_CLOSING = float("inf")
"""``Peer._close_began`` while no graceful close has begun (:meth:`Closing.close` sets it to
the loop time it begins at)."""

log = logging.getLogger("peerwire.rpc")


async def refused_closing(
    exc: BaseException,
    closed: asyncio.Future[Any],
    deadline: float,
    loop: asyncio.AbstractEventLoop,
) -> bool:
    """Whether ``exc`` is the refusal of a peer closing gracefully (RetryLater of
    :data:`~rpc.errors.CLOSING`: not run); if it is, this returns once the connection's
    ``closed`` future is done, or at loop time ``deadline``: sent again on the draining
    connection, the call would only be refused again."""
    if exc.__class__ is not RetryLater or exc.args[0] != CLOSING:
        return False
    if not closed.done():
        await asyncio.wait((closed,), timeout=max(0.0, deadline - loop.time()))
    return True


async def stream_error(
    exc: BaseException, closed: asyncio.Future[Any], wait: ResultWait
) -> BaseException:
    """``exc``, the error a stream's reader raises next: a refusal of a peer closing once
    the connection has closed (:func:`refused_closing`), within the stream's deadline, else
    one item timeout."""
    loop = wait.loop
    deadline = wait.deadline if wait.deadline is not None else loop.time() + wait.item
    await refused_closing(exc, closed, deadline, loop)
    return exc


class Closing:
    """How a connection closes (mixed into :class:`~rpc.peer.Peer`)."""

    _transport: Any
    _loop: asyncio.AbstractEventLoop
    _calls: dict[Any, Any]
    _tasks: TaskSet
    _runner: HandlerRunner[Any]
    _closers: set[asyncio.Task[Any]]
    _kept: Backlog
    _close_began: float
    _stream_hold: StreamHold
    adapter: Any
    outbox: Outbox
    deadlines: Deadlines
    closed: asyncio.Future[BaseException | None]
    gave_up: BaseException | None
    remote_address: Any

    if TYPE_CHECKING:

        @property
        def protocol_name(self) -> str: ...

        def connection_lost(self, exc: BaseException | None) -> None: ...

        def calls_waited_for(self) -> list[asyncio.Future[Any]]: ...

        def drop_input(self) -> None: ...

        def _keep_unread(self) -> None: ...

    def abort(self, exc: BaseException | None = None, *, refused: bool = False) -> None:
        """Close now, dropping work in flight; ``exc``, why (kept as ``gave_up``, the first
        reason given, where the reconnecting client and ``connect`` read it; without one,
        "aborted by this side"). Queued bytes (a protocol's last word, such as Gotalk's
        ``f`` message) still go out, then the connection is cut without waiting for the
        peer's side of a closing handshake (a TLS close_notify, a WebSocket close frame): a
        peer given up on is not waited for. Bytes the transport could not hand to the socket
        at once have :data:`LINGER` s; a peer that has stopped reading is cut at once.

        ``refused``: for input the peer may still be sending (a protocol violation, such as
        a message refused from its header). A WebSocket's closing handshake then runs,
        within the linger, and the rest of that input is dropped as it comes: cut with
        input unread, the socket resets, and browsers and Node drop what they had not read,
        the last word included, and report 1006."""
        transport = self._transport
        if transport is None:
            return
        if self.gave_up is None:
            self.gave_up = exc if exc is not None else ConnectionClosed("aborted by this side")
        if self.outbox.blocked or transport.is_closing():
            transport.abort()
            return
        self._close_transport()
        if refused and transport.get_extra_info("message_framed"):
            return  # the WebSocket closing handshake, bounded by the linger
        if not transport.get_write_buffer_size():
            transport.abort()  # the last word is the socket's: cut, as TCP's close() does

    def _close_transport(self) -> None:
        """Write what is queued and close; a connection not gone :data:`LINGER` s later
        (bytes the peer has not taken, a closing handshake it has not answered) is cut then.
        A transport closing already is not closed again (asyncio's TLS transport breaks on
        a second close())."""
        transport = self._transport
        if not transport.is_closing():
            self.outbox.flush()
            transport.close()
        self._linger()

    def _linger(self) -> None:
        if self.deadlines.when("linger") is None:
            self.deadlines.set("linger", self._loop.time() + LINGER, self._linger_due)

    def _linger_due(self) -> None:
        if self._transport is not None:
            log.info(
                "%s peer %s did not take what was left to send, or answer our close, "
                "within %s s of closing; cut off",
                self.protocol_name,
                self.remote_address,
                LINGER,
            )
            self._transport.abort()

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Graceful close: wait (up to ``drain_timeout``) for in-flight work, then close;
        requests read before and kept unrun (:mod:`rpc.backlog`: our output backed up,
        slots taken) are waited for too, and run or get a retry result (not behind the full
        queue of a stream of ours: our streams are cut). The peer's requests that come
        meanwhile run while calls of ours are in flight (the peer's handlers of those may
        call us back to answer them), and are waited for too, within the same
        ``drain_timeout``. Once none is, they are refused (:meth:`Responder.refuses`): a
        peer that takes retry results gets them; one that does not gets nothing (its
        requests and notifications are dropped unrun, :meth:`Responder.turned_away`), and
        the close ends once what it sent before has run, not at ``drain_timeout`` however
        busy the peer. The peer is read throughout: the replies to our calls, its
        cancellations and the parts of its stream requests that run are handled.
        Called from a handler (or notification) of this connection, it does not wait for
        that one, which is cancelled with the connection's other work once it is closed.
        (Awaited directly: ``asyncio.wait_for`` or ``shield`` run it in a task of its own on
        3.11, which then waits for the handler too, up to ``drain_timeout``.) Cancelled
        while it waits for that work (``wait_for``'s timeout), it closes at once."""
        if self._transport is None and not self.closed.done():
            self.connection_lost(None)  # never opened (a TLS handshake still running)
            return
        if self.gave_up is None:
            self.gave_up = ConnectionClosed("closed by this side")
        if self._close_began == NOT_CLOSING:
            self._close_began = self._loop.time()
            self._keep_unread()
            self._kept.read_before(self._close_began)  # (uvloop: read in the same ms)
            if self._kept.messages:  # from now on parts of streams whose handler does not
                # run are dropped as read (InputFlow._runs_now); those kept go at this look
                self._kept.recheck()
                self._kept.next_turn()
        current = asyncio.current_task(self._loop)
        closers = self._closers
        if current is not None:
            closers.add(current)
        turns_away = not self.adapter.retry_results
        try:
            waited = self.calls_waited_for()  # in flight now: later ones are cut
            deadline = self._loop.time() + drain_timeout
            left: set[Any] = set()
            while True:  # again as our calls end, and for requests run while they ran
                pending: list[Any] = [call for call in waited if not call.done()]
                calls = bool(pending)  # wait for the first to end
                pending += [task for task in self._tasks if task not in closers]
                drained = self._runner.drain(closers)  # those served now, not later ones
                if drained is not None:
                    pending.append(drained)
                if self._kept.messages and not self._stream_hold.active:  # read before,
                    # kept (our output backed up, slots taken): they run, or are refused; not
                    # behind a stream's full queue (ours: cut by the close; the peer's: its
                    # handler, waited for, ends the hold)
                    pending.append(self._kept.emptied())
                if not pending:
                    left = set()  # (not the last wait's: nothing is cut)
                    break
                try:
                    _, left = await asyncio.wait(
                        pending,
                        timeout=max(0.0, deadline - self._loop.time()),
                        return_when=asyncio.FIRST_COMPLETED if calls else asyncio.ALL_COMPLETED,
                    )
                except asyncio.CancelledError:  # the caller stopped waiting, not closing
                    if self._transport is not None:
                        self._end(turns_away)
                    raise
                if self._transport is None or self._loop.time() >= deadline:
                    break
                if left and not calls:  # (woken by the timeout a tick early)
                    break
            if left and self._transport is not None:
                self._tell_cut(left, closers, drain_timeout)
            if self._transport is not None:
                self._end(turns_away)
            await asyncio.shield(self.closed)
        finally:
            closers.discard(current)

    def _tell_cut(self, left: set[Any], closers: set[Any], drain_timeout: float) -> None:
        """Warn of the work a graceful close's drain left running (in ``left``, what its
        last wait still waited for), counted as it is now: nothing when all of it ended in
        the deadline's own turn. A handler that called the close is not counted (the drain
        does not wait for it either)."""
        runner = self._runner
        workers = set(runner.workers())
        handlers = runner.jobs - sum(1 for task in closers if task in workers)
        handlers += sum(1 for task in self._tasks if task not in closers)
        calls = sum(1 for c in self._calls.values() if c.future in left)
        kept = len(self._kept)
        if not handlers and not calls and not kept:
            return
        cuts.warning(
            "%s peer %s: %d handler(s) and %d call(s) of ours still running after the %s-s "
            "drain are cut%s",
            self.protocol_name,
            self.remote_address,
            handlers,
            calls,
            drain_timeout,
            f", {kept} message(s) read and kept unrun dropped" if kept else "",
        )

    def _end(self, turns_away: bool) -> None:
        """Close the transport at a graceful close's end. For a peer that takes no retry
        results (whose input it turned away), what it still sends is read and dropped
        meanwhile: the TLS close_notify or WebSocket close frame behind it ends the closing
        handshake. Over TCP our FIN goes behind the answers, and the peer's own FIN, or a
        pause of its input (:data:`QUIET`), ends the connection within the :data:`LINGER`:
        closed with its input unread, the socket would reset, and a peer may then drop
        answers it had not read yet. Meanwhile the connection is not open
        (:attr:`~rpc.peer.Peer.is_open`), and what is still written to it (a cut handler's
        answer, a heartbeat) is dropped, as once it closes."""
        transport = self._transport
        if turns_away:
            self.drop_input()
            if not transport.is_closing() and transport.can_write_eof():
                self.outbox.flush()
                transport.write_eof()  # nothing more goes out: what handlers cut at the
                self.outbox.lost(ConnectionClosed("closed by this side"))  # drain's end
                # answer meanwhile is dropped, as once closed (the transport would raise)
                self._linger()
                self._quiet()
                return
        self._close_transport()

    def input_dropped(self) -> None:
        """Input read and dropped once a graceful close ended it: a TCP peer we half-closed
        (:meth:`_end`) is read on until its FIN, or until its input pauses :data:`QUIET` s."""
        if self.deadlines.when("quiet") is not None:
            self._quiet()

    def _quiet(self) -> None:
        self.deadlines.set("quiet", self._loop.time() + QUIET, self._quiet_due)

    def _quiet_due(self) -> None:
        if self._transport is not None:
            self._close_transport()

"""A connection's RPC state: the protocol the loop drives, input flow, closing.

Path of a request, in one direction: the transport reads into the thread's buffer
(:mod:`transports.read_buffer`) and calls :meth:`Peer.data_received` with the bytes; the
peer's protocol adapter (:mod:`rpc.gotalk_peer`, :mod:`rpc.chatter_peer`) decodes the bytes
into codec messages and :meth:`~rpc.input_flow.InputFlow._run` hands each to the adapter's
``dispatch``, which calls :meth:`Peer.on_request` (or ``on_result`` ...); the handler runs
(inline when it is a plain function; as a job of the peer's
:class:`~rpc.handler_runner.HandlerRunner` when it is a coroutine or async generator); its
result goes back through the adapter's encoder into the :class:`~rpc.outbox.Outbox`, which
writes what one read produced at its end, with a write forced every 16 messages or 64 KiB
queued.

The peer is five parts, each in its module: this one (the transport's callbacks and the
connection's state), :class:`~rpc.input_flow.InputFlow` (which messages run now, which
wait, when reading pauses), :class:`~rpc.responder.Responder` (the calls the peer makes to
us), :class:`~rpc.calls.Caller` (the calls we make) and :class:`~rpc.closing.Closing`
(abort, graceful close, the linger after it); its settings and the wire format's adapter
are in :mod:`rpc.options`.

Everything per connection is bounded and freed when the connection goes:
- calls of ours in ``_calls`` (bounded by the caller; each has a deadline or, for a
  stream, a wait per result);
- incoming streams in ``_streams`` (at most ``max_concurrent``; each queue at most
  ``max_stream_queue`` parts, past which reading pauses: :mod:`rpc.stream_hold`);
- requests being served in the :class:`~rpc.handler_runner.HandlerRunner` (jobs, queued or
  running, and a worker task per job that waits) and tasks in a :class:`~rpc.tasks.TaskSet`
  (notifications, ``on_open``): together at most ``max_concurrent``. Past it a request
  gets a retry result from a peer that takes them, else it waits in the backlog, as does
  a notification while ``max_concurrent`` tasks run (it has no answer to refuse it with),
  and replies to our calls still run (:mod:`rpc.input_flow`). Their payloads and the
  parts queued for stream handlers hold at most ``max_request_bytes``
  (:mod:`rpc.request_bytes`). The callers' deadlines of those that came with one are in
  ``call_bounds`` (one entry per waiting handler);
- decoded messages read but not run yet, in order, and their bound (:mod:`rpc.backlog`
  says which wait there, and when reading pauses or goes on meanwhile), and the rest of a
  large read not decoded yet (at most that read, reading paused: :meth:`Peer._read`);
- output in the outbox and the transport, above ``high_water`` bytes: :mod:`rpc.outbox`.
All timers share one :class:`~rpc.deadlines.Deadlines` per connection.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from rpc.backlog import KEPT_READ_SIZE, Backlog
from rpc.backlog import MESSAGES_PER_TURN as MESSAGES_PER_TURN
from rpc.call_bounds import CallBounds
from rpc.calls import Caller
from rpc.calls import _Call as _Call
from rpc.closing import NOT_CLOSING, Closing
from rpc.deadlines import Deadlines
from rpc.errors import ConnectionClosed
from rpc.handler_runner import HandlerRunner
from rpc.input_flow import DROPPED, READ, InputFlow
from rpc.key import K
from rpc.logs import refusals, violations
from rpc.options import Adapter, Options
from rpc.outbox import Outbox
from rpc.registry import Registry, default_registry
from rpc.request_bytes import RequestBytes
from rpc.responder import Responder, current_peer
from rpc.responder import _parts as _parts
from rpc.stream_hold import RoomStall, StreamHold
from rpc.streaming import ResultWait, StreamQueue
from rpc.tasks import TaskSet
from transports.read_buffer import SharedBufferProtocol, read_buffer
from transports.stream import ClosedHere
from wire.errors import ProtocolError

# (the "x as x" imports above: names read as rpc.peer.<name>, e.g. by rpc.intercept)
__all__ = ["Adapter", "Options", "Peer", "ResultWait", "current_peer"]

log = logging.getLogger("peerwire.rpc")


class Peer(InputFlow[K], Responder[K], Caller[K], Closing, SharedBufferProtocol):
    """One connection's RPC state. Built by :class:`~rpc.gotalk_peer.GotalkPeer` or
    :class:`~rpc.chatter_peer.ChatterPeer` with their adapter.

    Its state is in slots: read per message, and past about 30 attributes an instance's
    dict loses CPython 3.11's fast attribute access (a Gotalk client's call cost 0.15 us
    more at 30 than at 29). The mixins leave it a ``__dict__`` for attributes of others."""

    __slots__ = (
        "_backlog",
        "_calls",
        "_calls_at",
        "_close_began",
        "_closers",
        "_ended",
        "_hold_told",
        "_input_end",
        "_intercepted",
        "_kept",
        "_loop",
        "_output_hold",
        "_reading",
        "_request_bytes",
        "_room_stall",
        "_runner",
        "_running",
        "_stream_hold",
        "_streams",
        "_task_slots",
        "_tasks",
        "_transport",
        "_unread",
        "accepted_at",
        "adapter",
        "call_bounds",
        "closed",
        "deadlines",
        "gave_up",
        "middleware",
        "on_open",
        "options",
        "outbox",
        "registry",
        "remote_address",
        "resumed_at",
        "state",
        "violation",
    )

    def __init__(
        self,
        adapter_factory: Callable[[Peer[K]], Adapter[K]],
        registry: Registry | None = None,
        options: Options | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self.options = options or Options()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: Any = None
        self.outbox = Outbox(loop)
        self.deadlines = Deadlines(loop)
        self.call_bounds = CallBounds(self.deadlines, loop)
        """Served calls' deadlines (callers' timeouts), on the deadlines' one timer."""
        self._tasks = TaskSet(loop, self._task_done)
        self._request_bytes = RequestBytes(self.options.max_request_bytes, self._bytes_freed)
        """Bytes held for the peer's requests (:mod:`rpc.request_bytes`): once under the
        limit again, held-back input gets a turn, as when a handler ends."""
        self._runner: HandlerRunner[K] = HandlerRunner(loop, self._task_done, self._request_bytes)
        """Requests being served by a coroutine, other awaitable or async generator handler,
        or through middleware (see :mod:`rpc.handler_runner`): at most ``max_concurrent``,
        counted with the tasks, and at most ``max_request_bytes`` of their payloads."""
        self._calls: dict[K, _Call] = {}
        self._calls_at = float("inf")
        self._streams: dict[K, StreamQueue] = {}
        self._ended: OrderedDict[K, None] = OrderedDict()
        self._running: set[K] = set()
        """Requests whose jobs the peer may cancel (see :meth:`on_cancel`), kept only while
        they run and only for a peer that takes the cancellation extension."""
        self._reading = True
        self._unread: tuple[bytes, int, float] | None = None
        """The rest of a read not decoded yet: its bytes, where the rest begins, and when it
        was read (:meth:`_read`); at most one read (``READ_SIZE``, 256 KiB, for a byte
        stream; a WebSocket message, up to ``max_size``), reading paused meanwhile."""
        self._input_end = READ
        """The input's phase (:data:`~rpc.input_flow.READ`, ``DROPPED`` at a graceful
        close's end or after a protocol violation: :mod:`rpc.input_flow`)."""
        self._close_began = NOT_CLOSING
        """The loop time a graceful close began (:meth:`~rpc.closing.Closing.close`): what
        is read after it may be turned away (:meth:`~rpc.responder.Responder.turned_away`).
        A read meanwhile while a call of ours is in flight moves it past that read (what
        the peer sent then runs, however long it is kept: :meth:`_read_in_close`)."""
        self._hold_told = False
        """The adapter was told of the current hold (``input_held``)."""
        self._output_hold = False
        """Reading stopped until the output drains (:meth:`answered_while_blocked`)."""
        self.resumed_at = 0.0
        """Loop time reading last resumed after we held the peer's input: what waited
        unread meanwhile (heartbeats, Pongs) is read only after it, so the liveness checks
        count silence from it at the earliest."""
        self.closed: asyncio.Future[BaseException | None] = loop.create_future()
        """Resolves (with the transport's exception or None) once the connection is gone."""
        self.accepted_at: float | None = None
        """Loop time a server accepted the connection (None for one we made): its
        ``handshake_timeout`` counts from then, so a TLS or WebSocket handshake counts too."""
        self.remote_address: Any = None
        self.on_open: Callable[[Peer], Any] | None = None
        """Called once the connection is up (a coroutine result runs as a task)."""
        self.state: dict[str, Any] = {}
        """Free room for the application's per-connection data (e.g. a session)."""
        self.violation: Exception | None = None
        """Why we closed the connection when the peer broke the protocol (else None)."""
        self.gave_up: BaseException | None = None
        """Why this side ended the connection (the first reason :meth:`abort` was given, or
        an abort or graceful :meth:`close` without one): a protocol violation, a handshake,
        liveness or input-rate limit, a failed ``on_open``, an error of ours; None when the
        peer closed it."""
        self.middleware = (*self.options.middleware, *self.registry.middleware)
        """The middleware of calls served here, outermost first (fixed at connection time;
        our own calls go through ``options.middleware`` alone)."""
        self._intercepted = bool(self.middleware)
        self._closers: set[asyncio.Task[Any]] = set()
        """Tasks waiting in :meth:`close`: the graceful close does not wait for those of
        them that are the connection's own (handlers or notifications that close it)."""
        self._task_slots = max(1, self.options.max_concurrent)
        """Notification (and ``on_open``) tasks at once: ``max_concurrent``, but at least
        one, since a notification cannot be refused (``max_concurrent=0`` refuses every
        request with a retry result; its notifications then run one at a time)."""
        self.adapter = adapter_factory(self)
        self._kept = Backlog(self._request_bytes, loop, self._continue, self.adapter)
        """Messages read but not run yet, their bound and next turn (:mod:`rpc.backlog`)."""
        self._backlog = self._kept.messages  # read here (the hot path's check), in responder
        self._stream_hold = StreamHold(self.deadlines, self._kept.next_turn)
        """The stream whose full queue holds our input, if any (:mod:`rpc.stream_hold`)."""
        self._room_stall = RoomStall(
            self.deadlines,
            self._streams,
            lambda: not self._reading and self._request_bytes.full,
            lambda key: self._stalled_parts(key, drop=True),
        )
        """Fails stream handlers that hold ``max_request_bytes`` unread while it stops our
        reading (:mod:`rpc.stream_hold`)."""

    @property
    def protocol_name(self) -> str:
        return self.adapter.name

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    # --- transport callbacks -------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        if self.closed.done():  # given up on during its TLS handshake (closed or timed out)
            transport.abort()
            return
        self._transport = transport
        self.remote_address = transport.get_extra_info("peername")
        self.outbox.attach(
            transport, high_water=self.options.high_water, low_water=self.options.low_water
        )
        self.adapter.start()
        if self.options.handshake_timeout:
            # a WebSocket transport knows when the socket was accepted, before its upgrade
            start = transport.get_extra_info("accepted_at", self.accepted_at)
            if start is None:
                start = self._loop.time()
            when = start + self.options.handshake_timeout
            self.deadlines.set("handshake", when, self._handshake_due, coarse=True)
        if self.on_open is not None:
            token = current_peer.set(self)
            try:
                result = self.on_open(self)
                if inspect.isawaitable(result):
                    self._tasks.spawn(self._opening(result))
            except Exception as exc:
                refusals.exception("%s: on_open callback failed; closing", self.remote_address)
                self.abort(exc)
            finally:
                current_peer.reset(token)
        self.outbox.flush()

    async def _opening(self, result: Awaitable[Any]) -> None:
        """An async ``on_open``: its failure closes the connection, as a plain one's does."""
        try:
            await result
        except Exception as exc:
            refusals.exception("%s: on_open callback failed; closing", self.remote_address)
            self.abort(exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where a byte stream's next read goes: the thread's buffer, only its first
        :data:`~rpc.backlog.KEPT_READ_SIZE` bytes while the backlog keeps messages."""
        view = read_buffer()
        return view[:KEPT_READ_SIZE] if self._backlog else view

    def data_received(self, data: bytes) -> None:
        """Bytes from the peer: what a stream transport read into the thread's shared
        buffer (:mod:`transports.read_buffer`), or a WebSocket message; dropped once the
        input is (:meth:`~rpc.input_flow.InputFlow.drop_input`)."""
        if self._input_end:
            self.input_dropped()
            return
        read_at = self._loop.time()  # the one clock read per read
        if self._close_began != NOT_CLOSING:  # a graceful close began
            read_at = self._read_in_close(read_at)
        self._read(data, 0, read_at)

    def _read(self, data: bytes, pos: int, read_at: float) -> None:
        """Decode ``data[pos:]``, read at loop time ``read_at``, and run or keep its messages.

        More than :data:`~rpc.backlog.KEPT_READ_SIZE` bytes are decoded in slices of that
        size past the message in progress (the adapter's ``missing``), so a large message
        is decoded in one go. The slices share one turn's ``MESSAGES_PER_TURN``; after a
        slice that used it up or left messages kept, the rest waits undecoded in
        ``_unread`` (reading paused) for the connection's next turn
        (:meth:`~rpc.input_flow.InputFlow._continue`). Else a read of 256 KiB of tiny
        messages (up to about 20,000) is decoded and kept in one callback, some 20 ms while
        every other connection waits. Not once a graceful close began: what was read
        before it is kept whole, as the close waits for that
        (:meth:`~rpc.input_flow.InputFlow._keep_unread`)."""
        outbox = self.outbox
        held = outbox.hold()  # one flush at the end: what handlers answer now goes together
        self._kept.read_at = read_at
        adapter = self.adapter
        end = len(data)
        budget = MESSAGES_PER_TURN  # messages this callback may yet handle
        try:
            while True:
                stop = end  # (a read that fits a slice: the common case, no look at missing)
                if end - pos > KEPT_READ_SIZE and self._close_began == NOT_CLOSING:
                    stop = min(end, pos + KEPT_READ_SIZE + adapter.missing)
                messages = adapter.decode(  # (a view: the codec copies what it keeps)
                    data if pos == 0 and stop == end else memoryview(data)[pos:stop], read_at
                )
                pos = stop
                if self._backlog:
                    self._hold(messages, 0)
                elif messages:
                    self._run(messages, budget if budget > 0 else 0)
                if pos == end or not self.is_open:  # (closed by a handler, or a violation)
                    break
                budget -= len(messages)
                if (budget <= 0 or self._backlog) and self._close_began == NOT_CLOSING:
                    self._unread = (data, pos, read_at)  # (a handler that began a graceful
                    # close: the rest is decoded whole, run or kept)
                    self._pause_reading()
                    if self._kept.refused is None:  # (a refusal's end gives the turn: tried
                        self._kept.next_turn()  # again before, it would be refused again)
                    break
        except ProtocolError as exc:
            if held:
                outbox.release(flush=False)
            self._violation(exc)
            return
        except Exception as exc:  # a bug of ours must not leave a half-dead connection behind
            if held:
                outbox.release(flush=False)
            log.exception("%s: unexpected error handling input; closing", self.protocol_name)
            self.abort(exc)
            return
        if held:
            outbox.release()

    def _read_in_close(self, read_at: float) -> float:
        """The time a read during a graceful close counts as read at: never before
        ``_close_began``, which a read while a call of ours is in flight moves past it, so
        that what it brings runs, kept or not, and what a later read brings with no call in
        flight does not (:meth:`~rpc.responder.Responder.turned_away`), in the same clock
        tick too (uvloop's counts whole ms: the times differ by a float's last digit).
        What is read between two calls of ours and kept past the second runs too."""
        read_at = max(read_at, self._close_began)
        if self.calls_waited_for():
            self._close_began = math.nextafter(read_at, math.inf)
        return read_at

    def eof_received(self) -> bool:
        """The peer's FIN closes the connection, and the handlers still running for it are
        cancelled: a FIN cannot tell a peer that left (closed, crashed, killed) from one
        that only stopped sending (``shutdown(SHUT_WR)``), and work for one that left
        would run on for nothing. nginx (its 499), the Go Gotalk server and hat-chatter do
        the same. A half-closing client gets the answers its read brought at once (plain
        function handlers), not those of coroutine handlers."""
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if isinstance(exc, ClosedHere) and self.gave_up is None:
            self.gave_up = exc  # a limit of the transport's (WebSocket): ours, not the peer's
        self._transport = None
        self.deadlines.close()
        self.call_bounds.clear()
        self.adapter.stop()
        error = ConnectionClosed(f"connection closed: {exc}" if exc else "connection closed")
        self.outbox.lost(error)
        self.fail_calls(error)
        for queue in self._streams.values():
            queue.put(error)
        self._streams.clear()
        self._ended.clear()
        self._running.clear()
        self._kept.clear()
        self._unread = None
        self._stream_hold.clear()
        self._room_stall.disarm()
        self._runner.close()
        self._tasks.cancel_all()
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:
        self.outbox.pause()  # reading goes on: _run and _continue hold what is not a reply

    def resume_writing(self) -> None:
        self.outbox.resume()
        self._kept.recheck()  # parts of running streams kept meanwhile may run now
        self._continue()
        self._kept.settle()

    def _violation(self, exc: ProtocolError) -> None:
        if exc is self.violation:  # the dead codec again: input after our last word
            return
        self.violation = exc
        violations.warning(
            "%s peer %s broke the protocol: %s", self.protocol_name, self.remote_address, exc
        )
        self.adapter.last_word(exc)
        self.abort(exc, refused=True)
        self.drop_input()  # a WebSocket's closing handshake reads on: nothing more runs

    def _handshake_due(self) -> None:
        if self.adapter.handshake_pending():
            timeout = self.options.handshake_timeout
            self.violation = TimeoutError(f"no handshake within {timeout} s")
            name, address = self.protocol_name, self.remote_address
            violations.warning(
                "%s peer %s sent nothing valid within %s s; closing", name, address, timeout
            )
            self.abort(self.violation)

    # --- state ---------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True until the connection closes, or a graceful close has ended the peer's
        input (:meth:`~rpc.input_flow.InputFlow.drop_input`: a TCP one half-closed)."""
        transport = self._transport
        return transport is not None and not transport.is_closing() and self._input_end != DROPPED

    def _check_open(self) -> None:
        """ConnectionClosed unless open (written out in ``Caller._send``, per request)."""
        if not self.is_open:
            raise ConnectionClosed("connection is closed")

    @property
    def read_at(self) -> float:
        """The loop time the message being dispatched was read at: a request's time left
        counts from it (for one kept a while: :attr:`rpc.backlog.Backlog.read_at`)."""
        return self._kept.read_at

    @property
    def transport(self) -> Any:
        """The transport (None once closed): ``get_extra_info`` gives the TLS certificate."""
        return self._transport

    async def drain(self) -> None:
        """Send what is queued and wait while the peer is not taking our output: call it
        between notifications to a slow reader. Raises ConnectionClosed if it goes away."""
        self.outbox.flush()
        await self.outbox.wait_writable()
        self._check_open()

    @property
    def write_buffer_size(self) -> int:
        """Bytes queued or held by the transport that the peer has not taken yet."""
        return self.outbox.buffered

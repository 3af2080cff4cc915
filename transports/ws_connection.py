"""One WebSocket connection: websockets' sans-I/O protocol driven by our own protocol.

:class:`Connection` is the protocol the loop is given (asyncio or uvloop). It feeds socket
bytes to a ``websockets`` ``ServerProtocol``/``ClientProtocol`` (public sans-I/O API only:
``receive_data``, ``events_received``, ``data_to_send``, ``send_*``, ``fail``) and hands every
text, binary or continuation frame's payload to a byte sink as bytes. The sink sees
:class:`~transports.ws_transport.WebSocketTransport`, an ``asyncio.Transport``: ``write``
= one binary message, ``writelines`` = one message per item.

One timer per connection for its phase, armed for its nearest deadline: the opening handshake
(``handshake_timeout``), then keepalive (a ping after ``ping_interval`` seconds without
incoming data, the connection failed when nothing arrives within ``ping_timeout``), then the
closing handshake (``close_timeout``, then the socket is aborted; a peer failed for its
silence is not waited for: the socket closes once our close frame is written); and, beside
it while open, the check that unfinished input keeps coming (``min_rate`` bytes a second once
``rate_grace`` has passed: :mod:`transports.ws_input_rate`). Backpressure: the socket's
write buffer limits drive the sink's ``pause_writing``/``resume_writing``; the sink's
``pause_reading`` stops reading the socket, and frames already parsed wait until it resumes
(:mod:`transports.ws_held`).
The socket is read while our output is backed up (so that the sink can take replies), but a
ping that comes then stops reading until the output drains: websockets answers every ping
with a pong, and a peer that pings and never reads would grow our buffer a pong at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, Protocol, cast

from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from transports.read_buffer import SharedBufferProtocol
from transports.stream import ByteSink, ClosedHere
from transports.ws_body import BodyFeed, send_response
from transports.ws_head import HeadSplit
from transports.ws_held import FRAMES_PER_TURN, HeldFrames
from transports.ws_input_rate import WsInputRate
from transports.ws_settings import Settings
from transports.ws_transport import WebSocketTransport

log = logging.getLogger("peerwire.transports.websocket")

_OPEN = State.OPEN
_LAST_DATA_OPCODE = Opcode.BINARY  # CONT, TEXT, BINARY are 0, 1, 2
Event = Request | Response | Frame


TIMER_EARLY = 0.001
"""A keepalive timer may fire up to the loop's clock resolution early (uvloop's is a whole
millisecond): a quiet period that ends within this many seconds has ended."""


def _has_ping(events: list[Event]) -> bool:
    return any(type(event) is Frame and event.opcode is Opcode.PING for event in events)


class Opening(Protocol):
    """The side-specific part of a connection: how it starts, opens and ends."""

    def started(self, conn: Connection) -> None: ...
    def handshake(self, conn: Connection, event: Request | Response) -> None: ...
    def lost(self, conn: Connection, exc: BaseException | None) -> None: ...


class Connection(SharedBufferProtocol):
    """Drives one sans-I/O websockets protocol over a socket; see the module docstring."""

    def __init__(
        self,
        ws: ServerProtocol | ClientProtocol,
        opening: Opening,
        settings: Settings,
        *,
        max_head: int | None = None,
    ) -> None:
        self.ws = ws
        self.opening = opening
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.made_at = self.loop.time()
        """When the connection was accepted (made): ``get_extra_info("accepted_at")``."""
        self.raw: asyncio.Transport | None = None
        self.sink: ByteSink | None = None
        self.transport: WebSocketTransport | None = None
        self.handshake_events: dict[str, Request | Response] = {}
        self.reading = True
        self.lost = False
        self._in_head = True
        """The opening handshake's HTTP head (request or response) is not parsed yet."""
        self._head = HeadSplit(max_head)
        """Where the head ends; ``max_head``: bytes the peer may send before (server)."""
        self.held = HeldFrames(self)
        """Data frames read but not handed to the sink yet (paused, or past a turn)."""
        self._write_paused = False
        self._body: BodyFeed | None = None
        """A response body still to write as the socket drains (:mod:`transports.ws_body`)."""
        self._pongs_wait = False
        """A ping came while our output was backed up: the socket is not read until the
        output drains (see the module doc)."""
        self._timer: asyncio.TimerHandle | None = None
        self._heard_at = 0.0
        """Loop time of the last read from the peer (keepalive counts silence from it)."""
        self._ping_out = False
        """A keepalive ping went out and nothing has been read since."""
        self._closing_timer = False
        self.resumed_at = 0.0
        """Loop time reading last resumed (input held till then does not count as slow)."""
        self.input_rate: WsInputRate | None = None
        """The rate check on unfinished input, while open (None: off, or not open)."""

    # --- the transport's callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection's transport: uvloop's are not asyncio.Transport subclasses
        self.attach(cast(asyncio.Transport, transport))
        self.opening.started(self)

    def attach(self, raw: asyncio.Transport) -> None:
        """Use ``raw`` (TCP or TLS) for I/O."""
        self.raw = raw
        sock = raw.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.set_write_buffer_limits(self.settings.high_water, self.settings.low_water)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            data = self._receive_head(data)
            if not data:
                return
        ws = self.ws
        ws.receive_data(data)
        self._heard_at = now = self.loop.time()
        self._ping_out = False
        events = ws.events_received()
        rate = self.input_rate
        out = ws.data_to_send()
        if out:
            self._send(out)
        if events:
            if self._write_paused and not self._pongs_wait and _has_ping(events):
                self._pongs_wait = True
                if self.raw is not None and not self.raw.is_closing():
                    self.raw.pause_reading()
            self._dispatch(events)
        if ws.state is not _OPEN:
            self._check_closing()
        elif rate is not None:  # after the sink took the frames: it says what it holds
            rate.read(now, len(data), events)

    def _receive_head(self, data: bytes) -> bytes:
        """Feed a read of the opening handshake up to its head's end (a server's within
        the ``max_head`` bytes left: 431 when it does not end there); the bytes to read
        next as frames. A server answers the request before it reads what came behind it:
        frames after a 101 (returned); after any other answer, which ends the connection,
        a pipelined request is dropped unread (RFC 9112, 9.6), as is all of it while an
        answer waits (the opening pauses reading until it sends it, never a 101). A client
        feeds what follows its 101 at once, so that what websockets queues for it (a pong)
        goes out before the sink's first message, and counts it toward the input rate as
        a read of its own (a server's count as the read they are returned to): else a peer
        that sends its head and part of a frame in one segment, then stalls, met only
        keepalive."""
        ws = self.ws
        server = isinstance(ws, ServerProtocol)
        head, rest = self._head.split(data)
        ws.receive_data(head)
        if rest and not server:
            ws.receive_data(rest)
        events = ws.events_received()
        out = ws.data_to_send()  # first: the sink opened below writes data_to_send()[0]
        if out:
            self._send(out)
        if events or ws.handshake_exc is not None:  # (not HTTP: websockets sent EOF)
            self._in_head = False
            self._dispatch(events)
            if ws.state is _OPEN and server:
                return rest
            rate = self.input_rate
            if rate is not None and ws.state is _OPEN and rest:
                frames = [event for event in events if type(event) is Frame]
                rate.read(self.loop.time(), len(rest), frames)
        elif self._head.room == 0 and isinstance(ws, ServerProtocol):
            self._in_head = False
            log.info(
                "WebSocket peer %s: request head over %d bytes", self.peername, self._head.limit
            )
            ws.send_response(ws.reject(431, "Request Header Fields Too Large\n"))
            self._send(ws.data_to_send())
        if ws.state is not _OPEN:
            self._check_closing()
        return b""

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self.ws.data_to_send()  # nothing to send past the peer's EOF: the socket closes
        feed, raw = self._body, self.raw
        if feed is not None and raw is not None and raw.can_write_eof():
            feed.then_close = True  # once the rest of the body is out (TCP: not TLS)
            return True
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.lost:
            return
        self.lost = True
        self._cancel_timer()
        self._stop_rate()
        self.held.drop()  # the read's frames
        self._body = None  # the cached file's view
        sink, self.sink = self.sink, None
        if sink is not None:
            ws = self.ws
            rcvd, sent = ws.close_rcvd, ws.close_sent
            error: ConnectionError | None = None
            if sent is not None and sent.code not in (1000, 1001) and not ws.close_rcvd_then_sent:
                # we failed it (a limit of ours: input rate, keepalive, a frame too large)
                error = ClosedHere(f"WebSocket closed by this side: {sent}", sent.code)
            elif rcvd is None or rcvd.code not in (1000, 1001):
                error = ConnectionError(f"WebSocket closed: {rcvd or 'no close frame'}")
            if error is not None:
                error.__cause__ = exc
            sink.connection_lost(error)
        self.opening.lost(self, exc)

    @property
    def peername(self) -> Any:
        return self.raw.get_extra_info("peername") if self.raw is not None else None

    def pause_writing(self) -> None:
        self._write_paused = True
        if self.sink is not None:
            self.sink.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._feed_body()
        if self._pongs_wait:
            self._pongs_wait = False
            self.resumed_at = self.loop.time()
            self.read_socket()
        if self.sink is not None:
            self.sink.resume_writing()

    # --- events ------------------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        sink = self.sink
        turn = FRAMES_PER_TURN
        for index, event in enumerate(events):
            if type(event) is Frame:
                if event.opcode <= _LAST_DATA_OPCODE and sink is not None:
                    # after any frames still held, in order; past a turn only while open: a
                    # read that closes is the last with frames (the socket may close at once)
                    if not self.reading or (not turn and self.ws.state is _OPEN):
                        self.held.hold(events[index:])
                        if self.reading:  # a turn's worth handed over: the rest at the next
                            if self.raw is not None and not self.raw.is_closing():
                                self.raw.pause_reading()
                            self.held.schedule()
                        return
                    turn -= 1
                    # asyncio sinks take bytes: a server's (masked) frames are bytes already
                    # (no copy), a client's are bytearrays the codecs would copy anyway
                    sink.data_received(bytes(event.data))
            elif isinstance(event, Request | Response):
                self.handshake_events["request" if type(event) is Request else "response"] = event
                self.opening.handshake(self, event)
                sink = self.sink
                if self.raw is None or self.raw.is_closing():
                    return

    def open(self, sink: ByteSink) -> WebSocketTransport:
        """The handshake succeeded: start keepalive and hand the connection to ``sink``."""
        if self.raw is None:
            raise RuntimeError("open() before connection_made()")
        self._cancel_timer()
        if self.settings.ping_interval:
            self._heard_at = self.loop.time()
            self._arm(self.settings.ping_interval, self._keepalive)
        if self.settings.min_rate:
            self.input_rate = WsInputRate(self, self.settings.min_rate, self.settings.rate_grace)
        transport = self.transport = WebSocketTransport(self, self.raw)
        self.sink = sink
        sink.connection_made(transport)
        if self._write_paused:
            sink.pause_writing()
        return transport

    # --- reading backpressure ----------------------------------------------------------------

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            if self.raw is not None and not self.raw.is_closing():
                self.raw.pause_reading()
            if self._keepalive_on() and self._held_for_sink():
                # the keepalive pings within half a timeout and on (see _keepalive), so
                # that the peer hears from us meanwhile
                when = self.loop.time() + self._half_timeout()
                if self._timer is None or self._timer.when() > when:
                    self._arm(when - self.loop.time(), self._keepalive)

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            # silence counts from now (what waited unread is read next); the armed
            # keepalive plans from it when it fires
            self._heard_at = self.resumed_at = self.loop.time()
            self._ping_out = False
            if self.held:
                self.held.schedule()
            else:
                if self.input_rate is not None:  # the sink may have finished what it held
                    self.input_rate.released(self.resumed_at)  # (the rest of a message)
                self.read_socket()

    def read_socket(self) -> None:
        """Read the socket again unless something still holds it: the sink's pause, frames
        held for it, or a ping waiting for our output to drain."""
        raw = self.raw
        if (
            self.reading
            and not self.held
            and not self._pongs_wait
            and raw is not None
            and not raw.is_closing()
        ):
            raw.resume_reading()

    # --- writing, closing ----------------------------------------------------------------

    def respond(self, response: Response) -> None:
        """Send the handshake response (a 101 opens the connection for frames). Not when
        websockets ended the connection already (it sent its EOF): the socket just closes."""
        ws = self.ws
        if isinstance(ws, ServerProtocol) and not ws.close_expected():
            out, self._body = send_response(ws, response)
            self._send(out)
            self._feed_body()
            if ws.state is not _OPEN:
                self._check_closing()

    def _feed_body(self) -> None:
        """Write a large body's chunks until the transport pauses us; then its end."""
        feed, raw = self._body, self.raw
        if feed is not None and raw is not None and feed.write(raw, lambda: self._write_paused):
            self._body = None
            if feed.then_close:  # the peer half-closed: close (not within its callback)
                self.loop.call_soon(raw.close)
            elif not raw.is_closing():
                self._send(feed.after)

    def flush(self) -> None:
        """Write what the sans-I/O protocol has queued."""
        self._send(self.ws.data_to_send())

    def _send(self, out: list[bytes]) -> None:
        raw = self.raw
        if raw is None:
            return
        for chunk in out:
            if chunk:
                raw.write(chunk)
            elif raw.can_write_eof():  # websockets' SEND_EOF: half-close, let the peer close
                raw.write_eof()
            else:  # TLS has no half-close
                raw.close()

    def close(self, code: int, reason: str = "") -> None:
        """Start the closing handshake; before the upgrade, just close the socket."""
        ws = self.ws
        if ws.state is _OPEN:
            ws.send_close(code, reason)
            self._send(ws.data_to_send())
            self._check_closing()
        elif ws.state is State.CONNECTING and self.raw is not None:
            self.raw.abort()

    def fail(self, code: int, reason: str) -> None:
        """Fail the connection (close frame if possible, then the socket)."""
        self.ws.fail(code, reason)
        self._send(self.ws.data_to_send())
        self._check_closing()

    def _check_closing(self) -> None:
        """Once the socket is expected to close, give it ``close_timeout`` seconds (and
        check its input's rate no more)."""
        if not self._closing_timer and self.ws.close_expected():
            self._stop_rate()
            self._closing_timer = True
            self._arm(self.settings.close_timeout, self._close_timed_out)

    def _close_timed_out(self) -> None:
        self._timer = None
        if self.raw is not None:
            self.raw.abort()

    # --- the input's rate -------------------------------------------------------------------

    @property
    def input_held(self) -> bool:
        """True while we do not read the peer (the sink paused us, or a ping waits for our
        output to drain): its unread input is not slow. Frames held for their turn are not:
        their payloads were counted as read (else a flood of empty frames, held nearly all
        the time, would start the count again at every check)."""
        return not self.reading or self._pongs_wait

    def _stop_rate(self) -> None:
        rate, self.input_rate = self.input_rate, None
        if rate is not None:
            rate.stop()

    # --- the phase's timer -----------------------------------------------------------------

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def arm_handshake_deadline(self, callback: Callable[[], None]) -> None:
        self._arm(self.settings.handshake_timeout, callback)

    def _held_for_sink(self) -> bool:
        """Reading paused by the sink for its own reasons (its handlers are busy), not
        because the peer stopped reading our output."""
        return not self.reading and not self._write_paused and self._sink_holds()

    def _half_timeout(self) -> float:
        return (self.settings.ping_timeout or self.settings.ping_interval or 0.0) / 2

    def _keepalive_on(self) -> bool:
        """Open, with keepalive pings, and not closing: the one timer is the keepalive's."""
        return bool(
            self.settings.ping_interval
            and self.sink is not None
            and self.ws.state is _OPEN
            and not self._closing_timer
        )

    def _sink_holds(self) -> bool:
        """Whether the sink that paused our reading will resume it (a Peer says so with
        ``holding_input``: a handler runs that will end the hold); a sink that does not
        say is taken at its word that it will."""
        return bool(getattr(self.sink, "holding_input", True))

    def _keepalive(self) -> None:
        """Silence is counted from the last read (or the end of a hold): a ping
        ``ping_interval`` after it, and the connection failed if nothing at all arrives
        within ``ping_timeout`` of the ping. A timer that fires while the peer spoke within
        the interval moves on to the interval's end after that read, without a ping. While
        the sink holds our reading, a ping goes out every half timeout instead."""
        self._timer = None
        settings = self.settings
        if self.ws.state is not _OPEN:
            return
        if self._held_for_sink():
            # its pong and data wait unread: ping it twice per timeout, so that it hears
            # from us, and judge it only once we read again
            self.ws.send_ping(os.urandom(4))
            self._send(self.ws.data_to_send())
            self._arm(self._half_timeout(), self._keepalive)
            return
        if self._ping_out:
            log.info("WebSocket peer %s: no answer to a ping: closing", self.peername)
            self.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            if self.raw is not None:  # nor will it answer the close (it may be gone, no FIN):
                # closed once that is written (close_timeout aborts past it; over TLS the
                # close waits TLS_SHUTDOWN_TIMEOUT for its close_notify: aborted sooner, a
                # slow peer's output still under TLS would be lost with the close frame)
                self.raw.close()
            return
        interval = settings.ping_interval or 0.0
        quiet_for = self._heard_at + interval - self.loop.time()
        if quiet_for > TIMER_EARLY:  # the peer spoke within the interval
            self._arm(quiet_for, self._keepalive)
            return
        self.ws.send_ping(os.urandom(4))
        self._send(self.ws.data_to_send())
        self._ping_out = True
        self._arm(settings.ping_timeout or interval, self._keepalive)

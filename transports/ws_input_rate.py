"""The least rate of a WebSocket peer's unfinished input: :class:`~transports.slow_input.SlowInput`
on the payload bytes its frames bring.

The input is unfinished while it ends inside a frame (a read that ended none), inside a
message sent in fragments (its last data frame is not the message's last), or inside a
message of the sink's own (a sink that says so with ``input_unfinished``: an RPC peer whose
codec holds part of a Gotalk or Chatter message, which may come a byte a WebSocket message).
Meanwhile the peer must send ``min_rate`` bytes a second of payload, on average, once
``rate_grace`` has passed, or it is sent close code 1008.

Only data frames' payloads count as progress: a read's size less the headers of the frames
it ends and the whole of its control frames (a peer that sends pings, or empty
continuation frames, keeps its connection busy but its message no longer), so that a read
of nothing but those counts less than nothing. Bytes of a frame not yet whole count as they
come; the frame's header is taken off when it ends. Per read, when nothing is unfinished
and no count runs: one scan for the last data frame and one attribute of the sink.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from websockets.frames import CloseCode, Frame, Opcode

from transports.logs import websocket_violations
from transports.slow_input import TLS_RECORD, SlowInput

if TYPE_CHECKING:
    from transports.ws_connection import Connection

EARLY = 0.001
"""A timer may fire up to the loop's clock resolution early (uvloop's: a whole millisecond)."""
_LAST_DATA_OPCODE = Opcode.BINARY  # CONT, TEXT, BINARY are 0, 1, 2


def _overhead(frame: Frame, masked: bool) -> int:
    """The bytes of ``frame`` on the wire that are not data: its header (2 bytes, 2 or 8
    more for a long payload, 4 for the mask of a client's), and a control frame's payload."""
    size = len(frame.data)
    head = (6 if masked else 2) + (0 if size < 126 else 2 if size < 65536 else 8)
    return head + size if frame.opcode > _LAST_DATA_OPCODE else head


class WsInputRate:
    """One open connection's rate check (see the module doc): the owner of its
    :class:`SlowInput`, with one timer of its own."""

    __slots__ = ("_conn", "_fragmented", "_masked", "_timer", "check")

    def __init__(self, conn: Connection, rate: float, grace: float, *, masked: bool) -> None:
        self._conn = conn
        tls = conn.raw is not None and conn.raw.get_extra_info("ssl_object") is not None
        self.check = SlowInput(self, rate, grace, credit=TLS_RECORD if tls else 0)
        self._masked = masked
        """The peer's frames are masked (it is a client; we serve)."""
        self._fragmented = False
        """The last data frame read did not end its message."""
        self._timer: asyncio.TimerHandle | None = None

    def read(self, at: float, size: int, events: list[Any]) -> None:
        """A read of ``size`` bytes at loop time ``at`` ended ``events`` (frames), which the
        sink has been given (or holds, paused)."""
        unfinished = self._unfinished(events)
        check = self.check
        if not unfinished and check.begun is None:
            return
        masked = self._masked
        for frame in events:
            size -= _overhead(frame, masked)
        check.read(at, size, 1 if unfinished else 0)

    def _unfinished(self, events: list[Any]) -> bool:
        if not events:
            return True
        last = events[-1]  # (most reads end in a data frame: no scan)
        if last.opcode <= _LAST_DATA_OPCODE:
            self._fragmented = not last.fin
        else:
            for event in reversed(events):
                if event.opcode <= _LAST_DATA_OPCODE:
                    self._fragmented = not event.fin
                    break
        return self._fragmented or bool(getattr(self._conn.sink, "input_unfinished", False))

    def stop(self) -> None:
        """The connection closes or is lost: no more checks."""
        self.check.rate = None
        self.unschedule()

    # --- InputOwner ------------------------------------------------------------------------

    def now(self) -> float:
        return self._conn.loop.time() + EARLY

    def schedule(self, when: float, coarse: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._conn.loop.call_at(when, self.check.due)

    def unschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def held_since(self, begun: float) -> bool:
        conn = self._conn
        return conn.input_held or conn.resumed_at > begun

    def too_slow(self, received: int, seconds: float) -> None:
        conn = self._conn
        websocket_violations.warning(
            "WebSocket peer %s: %d bytes in %.1f s with a frame or message unfinished, under "
            "%s bytes a second (min_rate); closing",
            conn.peername,
            received,
            seconds,
            self.check.rate,
        )
        self.stop()
        conn.fail(CloseCode.POLICY_VIOLATION, "input too slow")

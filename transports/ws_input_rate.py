"""The least rate of a WebSocket peer's unfinished input: :class:`~transports.slow_input.SlowInput`
on the payload bytes its frames bring.

The input is unfinished while it ends inside a frame (a read that ended none), inside a
message sent in fragments (its last data frame is not the message's last), or inside a
message of the sink's own (a sink that says so with ``input_unfinished``: an RPC peer whose
codec holds part of a Gotalk or Chatter message, which may come a byte a WebSocket message).
Meanwhile the peer must send ``min_rate`` bytes a second of payload, on average, once
``rate_grace`` has passed, or it is sent close code 1008.

Only data frames' payloads count as progress (a peer that sends pings, or empty
continuation frames, keeps its connection busy but its message no longer): a read that ends
frames counts the payloads of its data frames. Bytes of a frame not yet whole count as they
come, and are taken back when a read ends it (its payload counts then), so the count never
runs more than one frame's header (14 bytes) ahead of the payloads, however the peer
encodes its lengths. Bytes after the last frame a read ends count once their frame ends.
The read that ends the opening handshake counts what came after the HTTP head (the
connection opens within it: :mod:`transports.ws_connection`), as a read of its own would.
Frames the connection held while paused count as read; once it hands them to the sink, the
sink is asked again (:meth:`WsInputRate.released`). Per read, when nothing is unfinished and
no count runs: a look at the last frame and one attribute of the sink.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from websockets.frames import CloseCode, Opcode

from transports.logs import websocket_violations
from transports.slow_input import TLS_RECORD, SlowInput

if TYPE_CHECKING:
    from transports.ws_connection import Connection

EARLY = 0.001
"""A timer may fire up to the loop's clock resolution early (uvloop's: a whole millisecond)."""
_LAST_DATA_OPCODE = Opcode.BINARY  # CONT, TEXT, BINARY are 0, 1, 2


class WsInputRate:
    """One open connection's rate check (see the module doc): the owner of its
    :class:`SlowInput`, with one timer of its own."""

    __slots__ = ("_conn", "_fragmented", "_partial", "_timer", "check")

    def __init__(self, conn: Connection, rate: float, grace: float) -> None:
        self._conn = conn
        tls = conn.raw is not None and conn.raw.get_extra_info("ssl_object") is not None
        self.check = SlowInput(self, rate, grace, credit=TLS_RECORD if tls else 0)
        self._partial = 0
        """Bytes counted of a frame not yet whole (taken back when it ends)."""
        self._fragmented = False
        """The last data frame read did not end its message."""
        self._timer: asyncio.TimerHandle | None = None

    def read(self, at: float, size: int, events: list[Any]) -> None:
        """A read of ``size`` bytes at loop time ``at`` ended ``events`` (frames), which the
        sink has been given (or holds, paused)."""
        unfinished = self._unfinished(events)
        check = self.check
        if not unfinished and check.begun is None:
            self._partial = 0
            return
        if events:
            size = -self._partial
            self._partial = 0
            for frame in events:
                if frame.opcode <= _LAST_DATA_OPCODE:
                    size += len(frame.data)
        else:
            self._partial += size
        check.read(at, size, 1 if unfinished else 0)

    def released(self, at: float) -> None:
        """The frames held while paused went to the sink, or the sink resumed reading: what
        it holds may have changed (an RPC peer decodes the rest of a message at its own
        turns, reading paused, ``rpc.peer.Peer._read``)."""
        unfinished = self._fragmented or bool(getattr(self._conn.sink, "input_unfinished", False))
        self.check.read(at, 0, 1 if unfinished else 0)

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

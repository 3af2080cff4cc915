"""The data frames a WebSocket connection read while its sink paused it, or past a turn,
held compactly.

websockets parses a whole read (up to 256 KiB) at once; when the sink pauses reading part
of the way through it (a peer's backlog full while it does not read our output), the rest
waits until the sink resumes; past ``FRAMES_PER_TURN`` frames, until the loop's next
iteration. Kept as websockets' ``Frame`` objects, a read of 1-byte
frames (about 37,000) held about 6 MB on each connection so paused, 24 times its bytes.
:class:`HeldPayloads` keeps their payloads in one bytes object and where each ends (4 bytes
a frame): a read's bytes and at most 4 bytes a frame, handed over one frame at a time.
:class:`HeldFrames` is a connection's part that holds them and hands them over, a turn's
worth a loop iteration while the sink reads, then has the connection read its socket again.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from websockets.frames import Frame, Opcode
from websockets.protocol import State

if TYPE_CHECKING:
    from transports.ws_connection import Connection

_LAST_DATA_OPCODE = Opcode.BINARY  # CONT, TEXT, BINARY are 0, 1, 2

FRAMES_PER_TURN = 256
"""Data frames handed to the sink in one go; the rest of a read (256 KiB: thousands of small
frames) waits for the loop's next iteration, the socket unread meanwhile. A frame is one read
of the sink's, so its own turn (``rpc.backlog.MESSAGES_PER_TURN``) never saw more than one:
before, 100 connections that flooded so kept a canary on another waiting 5 to 8.7 s."""


class HeldPayloads:
    """Data frames' payloads not given to the sink yet, in order (control frames, which
    websockets has handled, are not kept)."""

    __slots__ = ("_data", "_ends", "_next")

    def __init__(self, payloads: Iterable[bytes | bytearray | memoryview]) -> None:
        ends = array("I")
        total = 0
        kept: list[bytes | bytearray | memoryview] = []
        for payload in payloads:
            kept.append(payload)
            total += len(payload)
            ends.append(total)
        self._data = b"".join(kept)
        self._ends = ends
        self._next = 0

    @classmethod
    def of(cls, held: HeldPayloads | None, frames: Iterable[object]) -> HeldPayloads:
        """What ``held`` still has, then the data frames among ``frames``."""
        rest = held.remaining() if held is not None else []
        data = [f.data for f in frames if type(f) is Frame and f.opcode <= _LAST_DATA_OPCODE]
        return cls(rest + data)

    def __bool__(self) -> bool:
        return self._next < len(self._ends)

    def pop(self) -> bytes:
        """The next payload (as bytes: what asyncio sinks take)."""
        index = self._next
        self._next = index + 1
        return self._data[self._ends[index - 1] if index else 0 : self._ends[index]]

    def feed(self, sink: Any, reading: Callable[[], bool], limit: int) -> None:
        """Hand at most ``limit`` payloads to ``sink`` (a byte sink), one at a time, while
        ``reading()``."""
        while self and limit and reading():
            limit -= 1
            sink.data_received(self.pop())

    def remaining(self) -> list[bytes | bytearray | memoryview]:
        return [self.pop() for _ in range(len(self._ends) - self._next)]


class HeldFrames:
    """The frames one connection holds (:class:`HeldPayloads`, None while none were) and
    their release: scheduled once however often asked before it runs; a release that finds
    reading paused again leaves them held for the next resume."""

    __slots__ = ("_conn", "_due", "payloads")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.payloads: HeldPayloads | None = None
        self._due = False
        """A release is scheduled (``call_soon``) and has not run yet."""

    def __bool__(self) -> bool:
        """Frames wait for the sink."""
        return bool(self.payloads)

    def hold(self, frames: Iterable[object]) -> None:
        """Keep the data frames among ``frames``, after those held already."""
        self.payloads = HeldPayloads.of(self.payloads, frames)

    def drop(self) -> None:
        """The connection is lost: let the read's payloads go."""
        self.payloads = None

    def schedule(self) -> None:
        """Release at the loop's next iteration."""
        if not self._due:
            self._due = True
            self._conn.loop.call_soon(self._release)

    def _release(self) -> None:
        """Hand over the frames held while paused or past a turn, a turn's worth a loop
        iteration, then read the socket again. Paused again since the resume that scheduled
        this: the frames stay held for the next."""
        self._due = False
        conn = self._conn
        if not conn.reading:
            return
        held = self.payloads
        if held is not None:
            if conn.sink is not None:  # paused again: the rest stays held
                held.feed(conn.sink, lambda: conn.reading, FRAMES_PER_TURN)
            if not held and self.payloads is held:  # all handed over: drop the read
                self.payloads = None
            elif held and conn.reading and self.payloads is held and conn.sink is not None:
                self.schedule()  # a turn's worth handed over: the rest at the next
            rate = conn.input_rate
            if rate is not None and conn.ws.state is State.OPEN:
                rate.released(conn.loop.time())
        conn.read_socket()

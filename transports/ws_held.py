"""The data frames a WebSocket connection read while its sink paused it, or past a turn,
held compactly.

websockets parses a whole read (up to 256 KiB) at once; when the sink pauses reading part
of the way through it (a peer's backlog full while it does not read our output), the rest
waits until the sink resumes; past ``FRAMES_PER_TURN`` frames, until the loop's next
iteration. Kept as websockets' ``Frame`` objects, a read of 1-byte
frames (about 37,000) held about 6 MB on each connection so paused, 24 times its bytes.
:class:`HeldPayloads` keeps their payloads in one bytes object and where each ends (4 bytes
a frame): a read's bytes and at most 4 bytes a frame, handed over one frame at a time.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import Any

from websockets.frames import Frame, Opcode

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

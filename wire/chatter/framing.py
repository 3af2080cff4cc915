"""Chatter stream framing: ``m`` (1 byte) | ``k`` (``m`` bytes, big-endian) | ``k`` bytes.

Senders use the minimal ``m`` (``k = 0`` goes out as ``01 00``); receivers accept any
``m`` from 0 to 255. The body size ``k`` is checked against ``max_size`` as soon as the
header is in, before any of the body is buffered.
"""

from __future__ import annotations

from wire.errors import MessageTooLarge

MAX_HEADER = 256
"""Largest possible header: the ``m`` byte plus 255 length bytes."""

SIZE_HEADERS = [bytes((1, k)) for k in range(256)]
"""The header of each body size below 256, by size."""


def frame_header(size: int) -> bytes:
    """The header for a body of ``size`` bytes, with the minimal ``m``."""
    if size < 256:
        return SIZE_HEADERS[size]
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((len(length),)) + length


class FrameReader:
    """Splits a byte stream into frame bodies, holding at most one partial frame.

    :meth:`receive_data` returns ``(buffer, [(start, end), ...])`` spans into a buffer that
    stays valid until the next call, so the envelope decoder reads bodies in place instead
    of copying each one out first.
    """

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return len(self._buf)

    @property
    def missing(self) -> int:
        """Bytes the stream must still bring to complete the frame held in part (0: none);
        while its header is incomplete, what completes the header (its size unknown)."""
        buf = self._buf
        if not buf:
            return 0
        body = 1 + buf[0]
        if len(buf) < body:
            return body - len(buf)
        return body + int.from_bytes(buf[1:body], "big") - len(buf)

    def receive_data(
        self, data: bytes | bytearray | memoryview
    ) -> tuple[bytes | bytearray, list[tuple[int, int]]]:
        if self._buf:
            self._buf += data
            buf: bytes | bytearray = self._buf
        else:
            buf = data if isinstance(data, bytes) else bytes(data)
        spans: list[tuple[int, int]] = []
        pos = 0
        total = len(buf)
        max_size = self.max_size
        while pos < total:
            m = buf[pos]
            body = pos + 1 + m
            if body > total:
                break
            size = buf[pos + 1] if m == 1 else int.from_bytes(buf[pos + 1 : body], "big")
            if size > max_size:
                self._buf = bytearray()  # nothing more will be read from this stream
                # a header may give 255 length bytes: not a number of 600 digits in a log line
                told = f"{size} bytes" if m <= 8 else f"a {m}-byte size"
                raise MessageTooLarge(f"Chatter frame of {told} exceeds max_size {max_size}")
            end = body + size
            if end > total:
                break
            spans.append((body, end))
            pos = end
        # Keep only the unconsumed tail. Spans point into ``buf``, which is never mutated
        # once it has handed out spans, so they stay valid for the caller.
        if pos == total:  # all of it read: the common case
            if buf is self._buf:
                self._buf = bytearray()
            # else the buffer was empty and unused: it stays, no new one per read
        elif pos == 0:
            if buf is not self._buf:
                self._buf = bytearray(buf)
        else:
            self._buf = bytearray(buf[pos:])
        return buf, spans

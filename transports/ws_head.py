"""Where the opening handshake's HTTP head ends in the reads that bring it.

A server feeds websockets its request head alone and answers it before it reads on: what
comes behind the head in the same read (early frames behind an upgrade, a pipelined
request) is read, if at all, only after the answer (:mod:`transports.ws_connection`).
"""

from __future__ import annotations

END = b"\r\n\r\n"
"""The head's end: websockets reads CRLF-ended lines, so the first blank line ends it (a
line it cannot parse fails the request before)."""


class HeadSplit:
    """Splits reads at the end of an HTTP head, within ``room`` bytes (None: no bound).

    Keeps the last 3 bytes of the head read so far (its end may span two reads) and the
    room left: owned by its connection, 3 bytes and two ints at most."""

    def __init__(self, room: int | None) -> None:
        self.limit = room
        """The room it was given (a server's ``max_request_head``)."""
        self.room = room
        """Bytes the head may still take (None: no bound); 0: it did not end within its room."""
        self._tail = b""

    def split(self, data: bytes) -> tuple[bytes, bytes]:
        """``data`` up to the head's end, or to the room left when the end is not within it
        (or all of it), and the rest."""
        room = self.room
        seen = data if room is None else data[:room]
        tail = self._tail
        end = (tail + seen).find(END)  # never within the tail alone: 3 bytes
        cut = len(seen) if end < 0 else end + len(END) - len(tail)
        head = data[:cut]
        self._tail = (tail + head)[-3:]
        if room is not None:
            self.room = room - cut
        return head, data[cut:]

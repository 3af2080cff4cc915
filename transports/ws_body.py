"""A large HTTP response body (a static file) written as the socket drains, not at once.

websockets serializes a response, head and body, into one new bytes object, and what the
socket cannot take at once stays in the transport's buffer (asyncio copies it there,
uvloop keeps the object): a peer that asked for an 8 MiB static file and never read held
a copy of it until its connection was cut (``close_timeout``, 10 s), one per connection
(10 such connections held 45 MB). A server's :class:`~transports.ws_connection.Connection`
instead sends the head alone, then the body in :data:`CHUNK`-byte views of the cached
file while the transport is under its high-water mark (256 KiB), the rest as it drains:
a connection holds at most that plus one chunk of it, and the end of the response (the
half-close) goes out after its last byte. A peer that half-closes after its request still
gets all of it over TCP (then the socket closes); over TLS, whose close_notify asyncio takes
for the end of the connection, the rest of the body is dropped. A :class:`BodyFeed` is a
view of the whole cached file, not a 64 KiB window: it keeps the file alive until the
response ends or the connection's close timeout (10 s) aborts it, so a cache entry evicted
or replaced meanwhile stays in memory that long (once, whatever the connections sending it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from websockets.http11 import Response
from websockets.protocol import SEND_EOF
from websockets.server import ServerProtocol

CHUNK = 64 * 1024
"""Bytes of a body written at a time; a body of at most this much goes out with its head."""


class BodyFeed:
    """What is left of a response body (a view of the cached file: no copy) and what
    websockets queued behind the response (its end of stream)."""

    __slots__ = ("after", "rest", "then_close")

    def __init__(self, body: bytes | bytearray, after: list[bytes]) -> None:
        self.rest = memoryview(body)
        self.after = after
        self.then_close = False
        """The peer half-closed (TCP): close the socket once the body is out, rather than
        let its EOF cut the body short."""

    def write(self, raw: asyncio.Transport, paused: Callable[[], bool]) -> bool:
        """Write chunks to ``raw`` until ``paused()`` (its protocol was asked to pause
        writing) or the body ends; True once it has ended (or ``raw`` is closing)."""
        while not paused():
            if raw.is_closing():
                return True
            chunk, self.rest = self.rest[:CHUNK], self.rest[CHUNK:]
            if not chunk:
                return True
            raw.write(chunk)
        return False


def send_response(ws: ServerProtocol, response: Response) -> tuple[list[bytes], BodyFeed | None]:
    """``ws.send_response(response)``, a body over :data:`CHUNK` (never a 101's) left out:
    what to write now, and the body's feed (None: nothing left). The head is what
    ``data_to_send()`` returns before its end of stream (``SEND_EOF``, ``b""``, which every
    response but a 101 ends with), in however many pieces; the body goes in before that."""
    if response.status_code == 101 or len(response.body) <= CHUNK:
        ws.send_response(response)
        return ws.data_to_send(), None
    ws.send_response(dataclasses.replace(response, body=b""))
    out = ws.data_to_send()
    end = out.index(SEND_EOF) if SEND_EOF in out else len(out)
    return out[:end], BodyFeed(response.body, out[end:])

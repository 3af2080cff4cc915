"""The least a peer can do, for ``bench_rpc.py`` to measure peerwire against.

- :class:`BareEchoServer` and :class:`BareEchoClient`: asyncio.Protocol on both sides, a
  4-byte big-endian length prefix; the server echoes every whole frame of one read with one
  write, the client coalesces the writes of one loop iteration. No protocol at all: the
  ceiling of any RPC over asyncio.
- :class:`MinimalGotalkClient`: a Gotalk v1 client in a few lines, as fast as it can be
  and no more: requests as one ``%`` format each, results matched by id in a dict, writes
  coalesced per loop iteration, a coroutine per call as a library's API would have. No
  timeouts, retries, errors, streams, limits or checks of what the server sends (a
  message other than a result or a heartbeat stops it). Run against peerwire's Gotalk
  server, it tells what that server allows a client; the difference to ``peerwire-gotalk``
  is what peerwire's own client costs.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import cast

_RESULT = ord("R")
_HEARTBEAT = ord("h")
_HEAD = 13
"""A result's header: ``R``, a 4-byte id and 8 hex digits of payload size; a heartbeat is
``h``, 4 hex digits of load and 8 of time: as long."""


def nodelay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off, as every peerwire transport does."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def split_frames(buf: bytearray, frames: list[bytes] | None) -> int:
    """Bytes used by the whole 4-byte-length-prefixed frames at the start of ``buf``;
    their bodies are appended to ``frames`` unless it is None."""
    pos = 0
    total = len(buf)
    while total - pos >= 4:
        end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
        if end > total:
            break
        if frames is not None:
            frames.append(bytes(buf[pos + 4 : end]))
        pos = end
    return pos


class BareEchoServer(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance test
        self.transport = cast(asyncio.Transport, transport)
        nodelay(transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        used = split_frames(buf, None)
        if used and self.transport is not None:
            self.transport.write(bytes(buf[:used]))  # every whole frame, echoed in one write
            del buf[:used]


class _Coalescing(asyncio.Protocol):
    """A client that writes what one loop iteration queued in one write."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.flush_handle: asyncio.Handle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's too (see above)
        nodelay(transport)

    def queue(self, data: bytes) -> None:
        self.out.append(data)
        if self.flush_handle is None:
            self.flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_handle = None
        out, self.out = self.out, []
        if self.transport is not None:
            self.transport.write(b"".join(out))


class BareEchoClient(_Coalescing):
    def __init__(self) -> None:
        super().__init__()
        self.waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        frames: list[bytes] = []
        del buf[: split_frames(buf, frames)]
        for frame in frames:  # replies come back in request order
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(frame)

    def request(self, payload: bytes) -> asyncio.Future[bytes]:
        future = self.loop.create_future()
        self.waiters.append(future)
        self.queue(len(payload).to_bytes(4, "big") + payload)
        return future


class MinimalGotalkClient(_Coalescing):
    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self.next_id = 0
        self.greeted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.write(b"01")  # ProtocolVersion

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        if not self.greeted:
            if end < 2:
                return
            pos, self.greeted = 2, True  # the server's version
        while end - pos >= _HEAD:
            kind = buf[pos]
            if kind == _HEARTBEAT:
                pos += _HEAD
                continue
            if kind != _RESULT:
                raise RuntimeError(f"the minimal client takes results only, not {kind!r}")
            stop = pos + _HEAD + int(buf[pos + 5 : pos + _HEAD], 16)
            if stop > end:
                break
            self.waiting.pop(bytes(buf[pos + 1 : pos + 5])).set_result(
                bytes(buf[pos + _HEAD : stop])
            )
            pos = stop
        del buf[:pos]

    async def request(self, op: bytes, payload: bytes) -> bytes:
        self.next_id = number = (self.next_id + 1) % 0x10000
        rid = b"%04x" % number
        future = self.loop.create_future()
        self.waiting[rid] = future
        self.queue(b"r%s%03x%s%08x%s" % (rid, len(op), op, len(payload), payload))
        return await future

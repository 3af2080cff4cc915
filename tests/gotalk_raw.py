"""A Gotalk peer written by hand over a real socket, for tests of peerwire's extension: the
announcement, metadata, defaults and requests as bytes, and the messages that come back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import rpc
from rpc import gotalk_peer
from tests.rpc_helpers import wait_until
from wire import gotalk, metadata


class RawGotalk:
    """One end of a Gotalk connection: ``connect`` makes a client that announces ``level``,
    ``accept`` a server end (for tests of our client). Heartbeats are skipped."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.codec = gotalk.GotalkConnection()
        self.pending: list[Any] = []

    @classmethod
    async def connect(cls, port: int, level: bytes = b"2") -> RawGotalk:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = cls(reader, writer)
        writer.write(raw.codec.handshake() + raw.notification(gotalk_peer.HELLO, level))
        return raw

    @classmethod
    def accept(cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> RawGotalk:
        raw = cls(reader, writer)
        writer.write(raw.codec.handshake())
        return raw

    @staticmethod
    def notification(name: str, payload: bytes) -> bytes:
        return b"".join(gotalk.encode_parts(gotalk.Notification(name, payload)))

    def request(self, rid: bytes, op: str, payload: bytes, timeout_ms: int | None) -> None:
        """A request preceded by its metadata: ``timeout_ms`` and one entry."""
        self.metadata(rid, metadata.RequestMeta(timeout_ms, {"k": "v"}))
        self.request_alone(rid, op, payload)

    def metadata(self, rid: bytes, meta: metadata.RequestMeta) -> None:
        """The metadata of request ``rid`` alone (its request to follow, or not)."""
        self.writer.write(self.notification(gotalk_peer.META, metadata.encode_gotalk(rid, meta)))

    def request_alone(self, rid: bytes, op: str, payload: bytes) -> None:
        """A request without metadata (level 3: under the default announced last)."""
        header = gotalk.request_header(gotalk.MessageType.REQUEST, rid, op, len(payload))
        self.writer.write(header + payload)

    def default(self, timeout_ms: int | None) -> None:
        """Announce the default time left of the requests without metadata (level 3)."""
        payload = metadata.encode_timeout_gotalk(timeout_ms)
        self.writer.write(self.notification(gotalk_peer.TIMEOUT, payload))

    def write(self, message: Any) -> None:
        self.writer.write(b"".join(gotalk.encode_parts(message)))

    async def next(self) -> Any:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), 10)
            assert data, "the other end closed"
            self.pending += [
                m for m in self.codec.receive_data(data) if not isinstance(m, gotalk.Heartbeat)
            ]
        return self.pending.pop(0)

    async def answer(self) -> Any:
        """The next message but a notification (the server's announcements)."""
        while isinstance(message := await self.next(), gotalk.Notification):
            pass
        return message

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def served_raw(
    registry: rpc.Registry, options: rpc.Options | None = None, **serve_options: Any
) -> AsyncIterator[tuple[RawGotalk, Any]]:
    """A ``tcp+gotalk`` server of ``registry`` with a :class:`RawGotalk` client connected:
    the client and the server's peer for it (closed after)."""
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=registry, options=options, **serve_options
    ) as server:
        raw = await RawGotalk.connect(server.url.port)
        try:
            await wait_until(lambda: len(server.peers) == 1)
            [peer] = server.peers
            yield raw, peer
        finally:
            await raw.close()

"""Input after a protocol violation over WebSocket runs no handler: the violation runs the
closing handshake (within the 5-s linger, cf4d9fd), and what the peer still sends meanwhile
is read and dropped (helper-166's review of cf4d9fd)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

import rpc
from tests.rpc_helpers import wait_until
from transports.websocket import HttpOptions
from wire import gotalk

pytestmark = pytest.mark.both_loops


class MuteWsClient:
    """A WebSocket client that reads nothing after its opening handshake: it goes on
    sending past the server's close frame, which it never sees."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ws: ClientProtocol
    ) -> None:
        self.reader, self.writer, self.ws = reader, writer, ws

    @classmethod
    async def open(cls, url: str) -> MuteWsClient:
        uri = parse_uri(url)
        reader, writer = await asyncio.open_connection(uri.host, uri.port)
        client = cls(reader, writer, ClientProtocol(uri, max_size=None))
        client.ws.send_request(client.ws.connect())
        client._flush()
        async with asyncio.timeout(5):
            while client.ws.state.name == "CONNECTING":
                client.ws.receive_data(await reader.read(65536))
        return client

    def _flush(self) -> None:
        for chunk in self.ws.data_to_send():
            if chunk:
                self.writer.write(chunk)

    def send(self, message: gotalk.Message) -> None:
        self.ws.send_binary(gotalk.encode(message))
        self._flush()

    def send_close(self) -> None:
        """Its close frame, then its end of the socket (read by the server in order)."""
        self.ws.send_close(1000)
        self._flush()
        self.writer.close()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def test_input_after_a_dispatch_violation_over_websocket_runs_no_handler() -> None:
    """cf4d9fd: a violation over WebSocket runs the closing handshake (within the 5-s
    linger), and what the peer still sends "is dropped as it comes" (docs/limits.md). A
    violation found past the codec (Gotalk: a part of an unknown stream) leaves the codec
    alive: the peer's next request and notification were decoded and their handlers ran,
    for a peer we gave up on. Before cf4d9fd the socket was cut at the violation."""
    ran: list[str] = []
    registry = rpc.Registry()

    @registry.handle("ran")
    def handler(data: bytes) -> bytes:
        ran.append("request")
        return data

    @registry.handle_notification("noted")
    def noted(data: bytes) -> None:
        ran.append("notification")

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        client = await MuteWsClient.open(server.url.websocket_uri)
        try:
            client.ws.send_binary(gotalk.GotalkConnection().handshake())
            await wait_until(lambda: len(server.peers) == 1)
            (peer,) = server.peers
            client.send(gotalk.StreamRequestPart(b"0001", b"x"))  # no such stream
            await wait_until(lambda: peer.violation is not None)
            client.send(gotalk.Request(b"0002", "ran", b"x"))
            client.send(gotalk.Notification("noted", b""))
            client.send_close()  # read after them: once closed, they were read
            async with asyncio.timeout(2):
                await peer.closed
            assert ran == []
        finally:
            await client.close()

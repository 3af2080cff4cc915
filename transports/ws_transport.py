"""What a WebSocket connection's byte sink holds: the connection as an ``asyncio.Transport``
(see :mod:`transports.ws_connection`, which makes one when the handshake succeeds)."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from websockets.frames import CloseCode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

if TYPE_CHECKING:
    from transports.ws_connection import Connection

_OPEN = State.OPEN

RETRY_FLAG = "peerwire-retry"
"""Query parameter peerwire's browser client sends: it understands Gotalk retry results."""


class WebSocketTransport(asyncio.Transport):
    """What the sink holds: one WebSocket connection as an ``asyncio.Transport``.

    Writes after the closing handshake started are dropped (as asyncio drops writes to a
    closed transport). ``get_extra_info("message_framed")`` is True; ``"request"`` and
    ``"response"`` give the opening handshake, ``"accepted_at"`` the loop time the
    connection was made; other names go to the socket's transport.
    """

    __slots__ = ("_conn", "_raw", "_ws")

    def __init__(self, conn: Connection, raw: asyncio.Transport) -> None:
        super().__init__()
        self._conn = conn
        self._ws = conn.ws
        self._raw = raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        ws = self._ws
        if ws.state is _OPEN:
            ws.send_binary(data)
            self._raw.write(ws.data_to_send()[0])

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        ws = self._ws
        if ws.state is _OPEN:
            for data in list_of_data:
                ws.send_binary(data)
            out = ws.data_to_send()
            if out:
                self._raw.writelines(out)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        """Start the closing handshake (code 1000); the socket closes when it completes."""
        self._conn.close(CloseCode.NORMAL_CLOSURE)

    def abort(self) -> None:
        self._raw.abort()

    def is_closing(self) -> bool:
        return self._ws.state is not _OPEN or self._raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "message_framed":
            return True
        if name == "accepted_at":  # loop time, before any TLS or WebSocket handshake
            return self._conn.made_at
        if name in ("request", "response"):
            return self._conn.handshake_events.get(name, default)
        if name == "peerwire_retry":  # the peer said it takes Gotalk "e" results
            if not isinstance(self._ws, ServerProtocol):  # (a client's request is its own)
                return False
            request = self._conn.handshake_events.get("request")
            query = request.path.partition("?")[2] if isinstance(request, Request) else ""
            return RETRY_FLAG in urllib.parse.parse_qs(query)
        return self._raw.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._raw.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._conn.pause_reading()

    def resume_reading(self) -> None:
        self._conn.resume_reading()

    def is_reading(self) -> bool:
        return self._conn.reading

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("a WebSocket transport feeds the sink it was opened with")

    def get_protocol(self) -> asyncio.BaseProtocol:
        # the sink is any ByteSink (the RPC core's Peer is one), not always a BaseProtocol
        return self._conn.sink  # type: ignore[return-value]

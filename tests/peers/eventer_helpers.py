"""Helpers for the eventer tests: real servers on 127.0.0.1 port 0, polling, and bare
Chatter peers that speak HatEventer bytes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import rpc
from rpc import eventer
from rpc.eventer import EventerServer, ServerConfig, common
from tests.rpc_helpers import wait_until as wait_until  # re-exported


def server_config(tmp_path: Path, **overrides: Any) -> ServerConfig:
    values: dict[str, Any] = {
        "listen": ["tcp+sbs://127.0.0.1:0"],
        "database": str(tmp_path / "events.db"),
        "sync": "normal",
    }
    values.update(overrides)
    return ServerConfig(**values)


@contextlib.asynccontextmanager
async def running_server(tmp_path: Path, **overrides: Any) -> AsyncIterator[EventerServer]:
    async with EventerServer(server_config(tmp_path, **overrides)) as server:
        yield server


def url_of(server: EventerServer) -> str:
    """The first listen URL, with the dialect a client needs."""
    return server.urls[0] + "?dialect=HatChatter"


def port_of(server: EventerServer) -> int:
    return int(server.urls[0].rsplit(":", 1)[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def json_event(event_type: tuple[str, ...], value: Any = None, source: Any = None) -> Any:
    return eventer.RegisterEvent(event_type, source, eventer.EventPayloadJson(value))


async def raw_peer(server: EventerServer, registry: rpc.Registry | None = None) -> rpc.Peer:
    """A bare Chatter peer that speaks HatEventer bytes (for protocol-level checks)."""
    return await rpc.connect(
        url_of(server),
        registry=registry or rpc.Registry(),
        sbs_repo=common.peer_repository(),
        reconnect=False,
    )


def init_bytes(
    name: str = "raw", token: str | None = None, subs: Iterable[Sequence[str]] = ()
) -> bytes:
    """A raw MsgInitReq for ``raw_peer``."""
    return common.encode(
        common.MSG_INIT_REQ, common.init_req_to_sbs(name, token, subs, None, False)
    )

"""Shared by the reconnecting client's tests (test_reconnect.py, test_reconnect_failover.py,
test_reconnect_direct.py): fast back-off, named registries, servers with or without TLS, a
transition recorder."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import rpc
from rpc.reconnect import ConnectionState, Transition
from tests.certs import Pki
from transports.stream import client_ssl_context, server_ssl_context

FAST = rpc.Reconnect(backoff=rpc.Backoff(base=0.01, cap=0.1))
OPEN = ConnectionState.OPEN
RECONNECTING = ConnectionState.RECONNECTING
CLOSED = ConnectionState.CLOSED


def named(name: str) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("who")
    def who(_value: Any) -> str:
        return name

    return reg


def contexts(pki: Pki, scheme: str) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """(server, client) TLS contexts for ``scheme`` (None, None without TLS)."""
    if not scheme.startswith(("ssl", "wss")):
        return None, None
    return (
        server_ssl_context(pki.server_cert, pki.server_key),
        client_ssl_context(cafile=pki.ca),
    )


async def serve(scheme: str, registry: rpc.Registry, pki: Pki, port: int = 0) -> rpc.Server:
    server_ctx, _ = contexts(pki, scheme)
    return await rpc.serve(f"{scheme}://127.0.0.1:{port}", registry=registry, ssl=server_ctx)


def open_peers(server: rpc.Server) -> int:
    """Connections the server has, all of them open (one just accepted may not be yet)."""
    peers = list(server.peers)
    return len(peers) if all(p.is_open for p in peers) else -1


class Recorder:
    """Every transition, with the loop time it happened at."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Transition]] = []

    def __call__(self, transition: Transition) -> None:
        self.seen.append((asyncio.get_running_loop().time(), transition))

    def states(self) -> list[ConnectionState]:
        return [t.state for _, t in self.seen]

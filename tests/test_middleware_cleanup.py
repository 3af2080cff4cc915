"""A streamed result that Metrics or Tracing watch (rpc.middleware.on_finish) is cleaned up
as soon as its consumer leaves early: the handler's ``finally`` / ``async with`` runs then,
not whenever a cyclic garbage collection finds the generator. Real servers and clients;
the stream is left while the server waits for its output to drain."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

import rpc
from rpc.metrics import Metrics
from rpc.tracing import Tracing
from tests.rpc_helpers import FLAVOURS, wait_until


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider()
    yield provider
    provider.shutdown()


def watched(kind: str, provider: TracerProvider) -> dict[str, Any]:
    """``serve()`` arguments that put on_finish around every streamed result."""
    if kind == "metrics":
        return {"metrics": Metrics(CollectorRegistry())}
    return {"middleware": [Tracing(provider)]}


def endless_registry(lock: asyncio.Lock, cleaned: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("export")
    async def export(_: Any) -> AsyncIterator[str]:
        try:
            async with lock:
                while True:
                    yield "x" * 1000
        finally:
            cleaned.set()

    @reg.handle("locked")
    async def locked(_: Any) -> str:
        async with lock:
            return "got the lock"

    return reg


async def leave_blocked_stream(server: rpc.Server, peer: rpc.Peer, how: str) -> None:
    """Start ``export``, read one part, wait until the server's output is blocked (the
    client reads no more), then leave: ``cancel`` the stream or ``close`` the connection."""
    parts = peer.stream("export", value=1)
    await anext(parts)
    [server_peer] = server.peers
    await wait_until(lambda: server_peer.outbox.blocked)
    if how == "cancel":
        await parts.aclose()
    else:
        await peer.close()


@pytest.mark.parametrize("kind", ["metrics", "tracing"])
@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_cancelled_stream_frees_its_lock(
    provider: TracerProvider, kind: str, flavour: str
) -> None:
    """The audit's case: a handler holds a lock across its yields; the client cancels
    the stream while the server waits to drain. The next call needing the lock gets it
    (before: it timed out, the lock held until a cyclic gc ran)."""
    lock = asyncio.Lock()
    cleaned = asyncio.Event()
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0",
        registry=endless_registry(lock, cleaned),
        **watched(kind, provider),
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as peer:
            await leave_blocked_stream(server, peer, "cancel")
            assert await peer.request("locked", 1, timeout=5) == "got the lock"
            assert cleaned.is_set()


@pytest.mark.parametrize("kind", ["metrics", "tracing"])
@pytest.mark.parametrize("how", ["cancel", "close"])
async def test_left_stream_is_closed_without_gc(
    provider: TracerProvider, kind: str, how: str
) -> None:
    """With the cyclic gc off, the handler's generator is closed all the same once the
    stream is cancelled or its connection closes (before: never, the wrapper's frame and
    the generator were kept in a reference cycle through the saved exception)."""
    lock = asyncio.Lock()
    cleaned = asyncio.Event()
    gc.collect()
    gc.disable()
    try:
        async with rpc.serve(
            "tcp+gotalk://127.0.0.1:0",
            registry=endless_registry(lock, cleaned),
            **watched(kind, provider),
        ) as server:
            async with rpc.connect(
                str(server.url), registry=rpc.Registry(), reconnect=False
            ) as peer:
                await leave_blocked_stream(server, peer, how)
                await asyncio.wait_for(cleaned.wait(), timeout=5)
                assert not lock.locked()
    finally:
        gc.enable()

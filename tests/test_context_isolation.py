"""A connection or server opened inside a served call (a proxy's handler) does not carry
that call's context variables into its own handlers: ``rpc.current_call`` there is the
call being served there, or none, not the proxy's (found by helper-123's hunt: before, the
handlers of such a connection saw the proxy's call, and its deadline, for its whole life)."""

from __future__ import annotations

import asyncio
import contextvars
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import rpc
from tests.certs import Pki
from tests.rpc_helpers import wait_until
from transports.stream import server_ssl_context

pytestmark = pytest.mark.timeout(30)

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("mark", default="unset")


async def marking(call: rpc.Call, call_next: Callable[[rpc.Call], Awaitable[Any]]) -> Any:
    """The proxy's middleware: sets a variable of the application's around its calls."""
    MARK.set("proxy's")
    return await call_next(call)


def seen() -> list[str]:
    """What a handler sees: the call being served (its op, or none) and MARK."""
    call = rpc.current_call.get(None)
    return [call.op if call is not None else "no call", MARK.get()]


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs", "ws+gotalk"])
async def test_a_connection_made_in_a_served_call_runs_its_handlers_without_it(
    scheme: str,
) -> None:
    """The proxy's handler connects to B; B calls back a handler of that connection."""
    client_side = rpc.Registry()
    client_side.handle("probe")(lambda params: seen())
    b_side = rpc.Registry()

    @b_side.handle("call_back")
    async def call_back(params: Any) -> Any:
        return await rpc.current_peer.get().request("probe", None)

    proxy_side = rpc.Registry()

    @proxy_side.handle("proxy")
    async def proxy(url: str) -> Any:
        async with rpc.connect(url, registry=client_side, reconnect=False) as peer:
            return await peer.request("call_back", None)

    async with (
        rpc.serve(f"{scheme}://127.0.0.1:0", registry=b_side) as b,
        rpc.serve(f"{scheme}://127.0.0.1:0", registry=proxy_side, middleware=[marking]) as a,
        rpc.connect(str(a.url), registry=rpc.Registry(), reconnect=False) as caller,
    ):
        assert await caller.request("proxy", str(b.url)) == ["no call", "unset"]


async def test_a_server_started_in_a_served_call_serves_without_it() -> None:
    inner_side = rpc.Registry()
    inner_side.handle("probe")(lambda params: seen())
    outer_side = rpc.Registry()

    @outer_side.handle("start")
    async def start(params: Any) -> str:
        server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=inner_side)
        started.append(server)
        return str(server.url)

    started: list[rpc.Server] = []
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=outer_side, middleware=[marking]
    ) as outer:
        try:
            async with rpc.connect(str(outer.url), registry=rpc.Registry()) as caller:
                url = await caller.request("start", None)
            async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as peer:
                assert await peer.request("probe", None) == ["no call", "unset"]
        finally:
            for server in started:
                await server.close()


OPENERS = ("start_stream_server", "start_websocket_server")


async def cancel_just_as_made(starting: Any) -> asyncio.Task[Any]:
    """Run ``starting`` (a Server.start()) and cancel it just after the transport's server
    was made, before the starting task resumed: the case in_own_context's ``undo`` is for."""
    me = asyncio.current_task()
    outer = asyncio.ensure_future(starting)
    inner: asyncio.Task[Any] | None = None
    for _ in range(10_000):
        await asyncio.sleep(0)
        if inner is None:
            inner = next(
                (
                    t
                    for t in asyncio.all_tasks()
                    if t is not outer and t is not me and t.get_coro().__name__ in OPENERS
                ),
                None,
            )
        if inner is not None and inner.done() and not outer.done():
            outer.cancel()
            break
    else:
        raise AssertionError("never caught the server just made")
    return outer


def port_listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "ws+gotalk", "ssl+gotalk"])
async def test_a_server_cancelled_just_as_it_was_made_is_closed(scheme: str, pki: Pki) -> None:
    """Cancelled just after its listener was made, before the starting task resumed: the
    listener is closed and the cancel goes through (helper-127's review: asyncio.Server's
    own close was called on uvloop's, TLS and WebSocket servers, AttributeError, and the
    port stayed open)."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    ssl = server_ssl_context(pki.server_cert, pki.server_key) if scheme.startswith("ssl") else None
    server = rpc.serve(f"{scheme}://127.0.0.1:{port}", registry=rpc.Registry(), sock=sock, ssl=ssl)
    outer = await cancel_just_as_made(server.start())
    try:
        with pytest.raises(asyncio.CancelledError):
            await outer
        await wait_until(lambda: not port_listening(port))
    finally:
        sock.close()


async def test_a_reconnecting_client_made_in_a_served_call_reconnects_without_it() -> None:
    """The reconnecting client's supervising task runs in a context of its own: on_connect
    after a reconnect (and on_state) does not see the served call that made the client
    (helper-127's review: it did, for the client's whole life)."""
    seen_on_connect: list[str] = []
    again = asyncio.Event()

    def on_connect(peer: rpc.Peer) -> None:
        call = rpc.current_call.get(None)
        seen_on_connect.append(call.op if call is not None else "no call")
        if len(seen_on_connect) > 1:
            again.set()

    clients: list[Any] = []
    proxy_side = rpc.Registry()

    @proxy_side.handle("make_client")
    async def make_client(url: str) -> None:
        clients.append(await rpc.connect(url, registry=rpc.Registry(), on_connect=on_connect))

    async with (
        rpc.serve("tcp+gotalk://127.0.0.1:0", registry=rpc.Registry()) as b,
        rpc.serve("tcp+gotalk://127.0.0.1:0", registry=proxy_side, middleware=[marking]) as a,
        rpc.connect(str(a.url), registry=rpc.Registry(), reconnect=False) as caller,
    ):
        try:
            await caller.request("make_client", str(b.url))
            for p in list(b.peers):
                p.abort()
            async with asyncio.timeout(10):
                await again.wait()
            assert seen_on_connect[1] == "no call", seen_on_connect
        finally:
            for client in clients:
                await client.close()

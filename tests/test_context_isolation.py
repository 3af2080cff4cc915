"""A connection or server opened inside a served call (a proxy's handler) does not carry
that call's context variables into its own handlers: ``rpc.current_call`` there is the
call being served there, or none, not the proxy's (found by helper-123's hunt: before, the
handlers of such a connection saw the proxy's call, and its deadline, for its whole life)."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import rpc

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

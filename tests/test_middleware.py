"""Middleware end to end over real sockets: order, rejection, failures inside middleware,
retry results, notifications, streams, and middleware on both ends of one connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import FLAVOURS
from tests.rpc_helpers import wait_until as wait_for

pytestmark = pytest.mark.parametrize("flavour", list(FLAVOURS))


def urls(flavour: str, port: int = 0) -> tuple[str, str]:
    scheme, query = FLAVOURS[flavour]
    return f"{scheme}://127.0.0.1:{port}", f"{scheme}://127.0.0.1:{port}{query}"


def recorder(name: str, log: list[tuple[str, ...]]) -> rpc.Middleware:
    async def middleware(call: rpc.Call, call_next: Any) -> Any:
        log.append((name, call.side, call.kind, call.op))
        result = await call_next(call)
        log.append((name, "done", call.op))
        return result

    return middleware


def base_registry(seen: list[Any]) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        seen.append(value)
        return value

    @reg.handle("whoami")
    def whoami(_: Any) -> Any:
        return rpc.current_call.get().context.get("subject")

    @reg.handle("count")
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @reg.handle_stream("sum")
    async def total(parts: AsyncIterator[int]) -> int:
        return sum([p async for p in parts])

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        seen.append(("note", value))

    return reg


async def test_order_server_then_registry_then_handler(flavour: str) -> None:
    log: list[tuple[str, ...]] = []
    seen: list[Any] = []
    reg = base_registry(seen)
    reg.use(recorder("registry-1", log))
    reg.use(recorder("registry-2", log))
    listen, _ = urls(flavour)
    serve_mw = [recorder("serve-1", log), recorder("serve-2", log)]
    async with rpc.serve(listen, registry=reg, middleware=serve_mw) as server:
        _, url = urls(flavour, server.url.port)
        client_mw = [recorder("client-1", log), recorder("client-2", log)]
        async with rpc.connect(url, registry=rpc.Registry(), middleware=client_mw) as peer:
            assert await peer.request("echo", {"a": 1}) == {"a": 1}
    assert log == [
        ("client-1", "client", "request", "echo"),
        ("client-2", "client", "request", "echo"),
        ("serve-1", "server", "request", "echo"),
        ("serve-2", "server", "request", "echo"),
        ("registry-1", "server", "request", "echo"),
        ("registry-2", "server", "request", "echo"),
        ("registry-2", "done", "echo"),
        ("registry-1", "done", "echo"),
        ("serve-2", "done", "echo"),
        ("serve-1", "done", "echo"),
        ("client-2", "done", "echo"),
        ("client-1", "done", "echo"),
    ]
    assert seen == [{"a": 1}]


async def test_rejection_and_failures_are_error_results(flavour: str) -> None:
    seen: list[Any] = []
    reg = base_registry(seen)

    @reg.use
    async def gate(call: rpc.Call, call_next: Any) -> Any:
        value = call.payload
        if b"reject" in value:
            raise rpc.Rejected("not allowed here")
        if b"boom-before" in value:
            raise ValueError("middleware broke before the handler")
        result = await call_next(call)
        if b"boom-after" in value:
            raise KeyError("after")
        return result

    listen, _ = urls(flavour)
    async with rpc.serve(listen, registry=reg) as server:
        _, url = urls(flavour, server.url.port)
        async with rpc.connect(url, registry=rpc.Registry()) as peer:
            with pytest.raises(rpc.RemoteError, match="not allowed here"):
                await peer.request("echo", "reject")
            with pytest.raises(rpc.RemoteError, match="middleware broke before the handler"):
                await peer.request("echo", "boom-before")
            with pytest.raises(rpc.RemoteError, match="after"):
                await peer.request("echo", "boom-after")
            with pytest.raises(rpc.RemoteError, match='unknown operation "nope"'):
                await peer.request("nope", "x")
            # the connection lives on, and the handler ran only when it was let through
            assert await peer.request("echo", "fine") == "fine"
            assert peer.is_open
    assert seen == ["boom-after", "fine"]


async def test_context_payload_and_result_replacement(flavour: str) -> None:
    seen: list[Any] = []
    reg = base_registry(seen)

    async def authenticate(call: rpc.Call, call_next: Any) -> Any:
        call.context["subject"] = f"{call.protocol}@{call.address[0]}"
        if call.op == "echo" and call.payload == b'"swap"':
            call.payload = b'"swapped"'
        result = await call_next(call)
        if call.op == "echo" and result == "wrap":
            return {"wrapped": result}
        return result

    listen, _ = urls(flavour)
    async with rpc.serve(listen, registry=reg, middleware=[authenticate]) as server:
        _, url = urls(flavour, server.url.port)
        async with rpc.connect(url, registry=rpc.Registry()) as peer:
            protocol = "gotalk" if flavour == "gotalk" else "chatter"
            assert await peer.request("whoami") == f"{protocol}@127.0.0.1"
            assert await peer.request("echo", "swap") == "swapped"
            assert await peer.request("echo", "wrap") == {"wrapped": "wrap"}
    assert seen == ["swapped", "wrap"]


async def test_retry_results_from_middleware(flavour: str) -> None:
    seen: list[Any] = []
    reg = base_registry(seen)
    refusals = 2
    client_log: list[tuple[str, ...]] = []

    async def limiter(call: rpc.Call, call_next: Any) -> Any:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise rpc.RetryLater("slow down", 0.01)
        return await call_next(call)

    async def client_side(call: rpc.Call, call_next: Any) -> Any:
        try:
            return await call_next(call)
        except rpc.RetryLater as exc:
            client_log.append(("retry", str(exc)))
            raise

    listen, _ = urls(flavour)
    async with rpc.serve(listen, registry=reg, middleware=[limiter]) as server:
        _, url = urls(flavour, server.url.port)
        async with rpc.connect(url, registry=rpc.Registry(), middleware=[client_side]) as peer:
            assert await peer.request("echo", 7) == 7
            refusals = 100
            with pytest.raises(rpc.RetryLater, match="slow down"):
                await peer.request("echo", 8, timeout=0.2)
    assert client_log[:2] == [("retry", "slow down"), ("retry", "slow down")]
    assert seen == [7]


async def test_notifications_and_streams_pass_through(flavour: str) -> None:
    log: list[tuple[str, ...]] = []
    seen: list[Any] = []
    reg = base_registry(seen)

    @reg.use
    async def no_secret_notes(call: rpc.Call, call_next: Any) -> Any:
        if call.kind == "notification" and b"secret" in call.payload:
            raise rpc.Rejected("dropped")
        return await call_next(call)

    listen, _ = urls(flavour)
    async with rpc.serve(listen, registry=reg, middleware=[recorder("s", log)]) as server:
        _, url = urls(flavour, server.url.port)
        client_mw = [recorder("c", log)]
        async with rpc.connect(url, registry=rpc.Registry(), middleware=client_mw) as peer:
            peer.notify("note", "secret")
            peer.notify("note", "public")
            assert [x async for x in peer.stream("count", value=3)] == [0, 1, 2]
            assert [x async for x in peer.stream("sum", parts=[1, 2, 3])] == [6]
            await wait_for(lambda: ("s", "done", "note") in log and len(seen) == 1)
    assert seen == [("note", "public")]
    assert ("s", "server", "notification", "note") in log
    assert ("c", "client", "request", "count") in log
    assert ("s", "server", "request", "count") in log
    assert ("c", "client", "stream", "sum") in log
    assert ("s", "server", "stream", "sum") in log
    assert not any(entry[0] == "c" and entry[-1] == "note" for entry in log)


async def test_middleware_on_both_ends_of_one_connection(flavour: str) -> None:
    """The server calls back into its caller; each end's middleware sees both directions."""
    server_log: list[tuple[str, ...]] = []
    client_log: list[tuple[str, ...]] = []
    reg = rpc.Registry()

    @reg.handle("ask_back")
    async def ask_back(value: int) -> int:
        caller = rpc.current_peer.get()
        return int(await caller.request("double", value)) + 1

    client_reg = rpc.Registry()

    @client_reg.handle("double")
    def double(value: int) -> int:
        return value * 2

    client_reg.use(recorder("client-registry", client_log))
    listen, _ = urls(flavour)
    serve_mw = [recorder("server", server_log)]
    async with rpc.serve(listen, registry=reg, middleware=serve_mw) as server:
        _, url = urls(flavour, server.url.port)
        client_mw = [recorder("client", client_log)]
        async with rpc.connect(url, registry=client_reg, middleware=client_mw) as peer:
            assert await peer.request("ask_back", 20) == 41
    assert server_log == [
        ("server", "server", "request", "ask_back"),
        ("server", "client", "request", "double"),
        ("server", "done", "double"),
        ("server", "done", "ask_back"),
    ]
    assert client_log == [
        ("client", "client", "request", "ask_back"),
        ("client", "server", "request", "double"),
        ("client-registry", "server", "request", "double"),
        ("client-registry", "done", "double"),
        ("client", "done", "double"),
        ("client", "done", "ask_back"),
    ]


async def test_client_middleware_can_refuse_and_answer_locally(flavour: str) -> None:
    seen: list[Any] = []
    reg = base_registry(seen)

    async def cache(call: rpc.Call, call_next: Any) -> Any:
        if call.payload == "cached":
            return "from cache"
        if call.payload == "forbidden":
            raise PermissionError("not sent")
        return await call_next(call)

    listen, _ = urls(flavour)
    async with rpc.serve(listen, registry=reg) as server:
        _, url = urls(flavour, server.url.port)
        async with rpc.connect(url, registry=rpc.Registry(), middleware=[cache]) as peer:
            assert await peer.request("echo", "cached") == "from cache"
            with pytest.raises(PermissionError):
                await peer.request("echo", "forbidden")
            assert await peer.request("echo", "sent") == "sent"
    assert seen == ["sent"]

"""OpenTelemetry spans through the Tracing middleware, read back from the SDK's in-memory
exporter: nesting across a peerwire-to-peerwire call, results, and no trace context on the
wire to peers that did not take peerwire's request metadata."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

import rpc
from rpc.tracing import Tracing
from tests.rpc_helpers import FLAVOURS, wait_until
from tests.test_rpc_gotalk_transcripts import (
    SKIPPED_NOTIFICATIONS,
    read_request,
    scripted_go_server,
)


def traced_registry(provider: TracerProvider) -> rpc.Registry:
    tracer = provider.get_tracer("handlers")
    reg = rpc.Registry()

    @reg.handle("work")
    async def work(value: int) -> int:
        with tracer.start_as_current_span("inside-handler"):
            return value + 1

    @reg.handle("fail")
    def fail(_: Any) -> None:
        raise RuntimeError("handler failed")

    @reg.handle("parts")
    async def parts(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @reg.handle("raw")
    def raw(data: bytes) -> bytes:
        return data

    return reg


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_spans_nest_across_a_peerwire_call(spans: Any, flavour: str) -> None:
    """Over a real connection, trace context crosses as request metadata, switched on by
    the connect-time announcement: the server span's parent is the client span."""
    provider, exporter = spans
    tracing = Tracing(provider)
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=traced_registry(provider), middleware=[tracing]
    ) as server:
        url = f"{server.url}{query}"
        async with rpc.connect(
            url, registry=rpc.Registry(), middleware=[tracing], reconnect=False
        ) as p:
            await wait_until(lambda: p.adapter.metadata)  # the server answered the announcement
            [server_peer] = server.peers
            assert server_peer.adapter.metadata
            with provider.get_tracer("app").start_as_current_span("outer"):
                assert await p.request("work", 1) == 2
            with pytest.raises(rpc.RemoteError):
                await p.request("fail")
            assert [x async for x in p.stream("parts", value=2)] == [0, 1]
    by_name: dict[str, list[Any]] = {}
    for span in exporter.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    outer = by_name["outer"][0]
    client, server_span = sorted(by_name["work"], key=lambda s: s.kind != SpanKind.CLIENT)
    inside = by_name["inside-handler"][0]
    assert client.kind == SpanKind.CLIENT and server_span.kind == SpanKind.SERVER
    trace_id = outer.context.trace_id
    assert {client.context.trace_id, server_span.context.trace_id, inside.context.trace_id} == {
        trace_id
    }
    assert client.parent.span_id == outer.context.span_id
    assert server_span.parent.span_id == client.context.span_id
    assert server_span.parent.is_remote
    assert inside.parent.span_id == server_span.context.span_id
    assert server_span.attributes["rpc.system"] == "peerwire"
    assert server_span.attributes["rpc.method"] == "work"
    assert server_span.attributes["rpc.peerwire.protocol"] == flavour.split("-")[0]
    assert server_span.attributes["rpc.peerwire.result"] == "ok"
    assert server_span.attributes["network.peer.address"] == "127.0.0.1"
    failed = {s.kind: s for s in by_name["fail"]}
    assert failed[SpanKind.SERVER].attributes["rpc.peerwire.result"] == "handler"
    assert failed[SpanKind.SERVER].status.status_code == StatusCode.ERROR
    assert failed[SpanKind.CLIENT].attributes["rpc.peerwire.result"] == "remote"
    assert failed[SpanKind.SERVER].parent.span_id == failed[SpanKind.CLIENT].context.span_id
    streamed = {s.kind: s for s in by_name["parts"]}
    assert streamed[SpanKind.SERVER].parent.span_id == streamed[SpanKind.CLIENT].context.span_id
    assert streamed[SpanKind.SERVER].attributes["rpc.peerwire.result"] == "ok"


async def test_server_calls_carry_trace_context_to_the_client(spans: Any) -> None:
    """The extension is symmetric: a handler calling back into its caller continues the
    trace on the client's side."""
    provider, exporter = spans
    tracing = Tracing(provider)
    reg = rpc.Registry()

    @reg.handle("call-back")
    async def call_back(_: Any) -> Any:
        return await rpc.current_peer.get().request("on-client", 5)

    client_reg = rpc.Registry()

    @client_reg.handle("on-client")
    def on_client(value: int) -> int:
        return value * 2

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, middleware=[tracing]) as s:
        async with rpc.connect(
            str(s.url), registry=client_reg, middleware=[tracing], reconnect=False
        ) as p:
            await wait_until(lambda: p.adapter.metadata)
            assert await p.request("call-back") == 10
    spans_by = {(s.name, s.kind): s for s in exporter.get_finished_spans()}
    outer_client = spans_by[("call-back", SpanKind.CLIENT)]
    back_client = spans_by[("on-client", SpanKind.CLIENT)]
    back_server = spans_by[("on-client", SpanKind.SERVER)]
    assert back_server.context.trace_id == outer_client.context.trace_id
    assert back_server.parent.span_id == back_client.context.span_id


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current", "chatter-legacy"])
async def test_no_trace_context_without_the_extension(spans: Any, flavour: str) -> None:
    """A client that does not announce the extension (or the legacy dialect, which cannot)
    sends the payload as it is, and the server's span starts a trace of its own."""
    provider, exporter = spans
    tracing = Tracing(provider)
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=traced_registry(provider), middleware=[tracing]
    ) as server:
        url = f"{server.url}{query}"
        async with rpc.connect(
            url, registry=rpc.Registry(), middleware=[tracing], extensions=False, reconnect=False
        ) as p:
            with provider.get_tracer("app").start_as_current_span("outer"):
                assert await p.request("raw", b"exact bytes", raw=True) == b"exact bytes"
            assert not p.adapter.metadata
            [server_peer] = server.peers
            assert not server_peer.adapter.metadata
    raw_spans = {s.kind: s for s in exporter.get_finished_spans() if s.name == "raw"}
    assert raw_spans[SpanKind.SERVER].parent is None
    client_trace = raw_spans[SpanKind.CLIENT].context.trace_id
    assert raw_spans[SpanKind.SERVER].context.trace_id != client_trace


async def test_nothing_new_reaches_a_go_server(spans: Any) -> None:
    """A traced request with a timeout to a server that ignores the announcement (the
    replayed behaviour of Go gotalk) carries neither trace context nor a deadline: the
    server sees the announcement, then the request exactly as without the extension."""
    provider, _ = spans

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rid, op, payload = await read_request(reader)
        assert (op, payload) == (b"echo", b'"hello"')
        writer.write(b"R" + rid + b'00000007"hello"')
        await reader.read()  # until the client closes

    SKIPPED_NOTIFICATIONS.clear()
    server, port = await scripted_go_server(script)
    tracing = Tracing(provider)
    url = f"tcp+gotalk://127.0.0.1:{port}"
    async with (
        server,
        rpc.connect(url, registry=rpc.Registry(), middleware=[tracing], reconnect=False) as peer,
    ):
        with provider.get_tracer("app").start_as_current_span("outer"):
            assert await peer.request("echo", "hello", timeout=5) == "hello"
        assert not peer.adapter.metadata
    assert SKIPPED_NOTIFICATIONS == [b"peerwire/hello"]


@pytest.mark.interop
async def test_nothing_new_reaches_a_hat_drivers_server(spans: Any) -> None:
    """The same against a real hat-drivers Chatter server (current dialect): every message
    it receives is one of our requests (its Pong to our announcement is empty)."""
    provider, _ = spans
    received: list[str] = []

    async def on_conn(conn: hat_chatter.Connection) -> None:
        while True:
            msg = await conn.receive()
            received.append(msg.data.type)
            await conn.send(hat_chatter.Data("Reply", msg.data.data), conv=msg.conv)

    srv = await hat_chatter.listen(on_conn, net.TcpAddress("127.0.0.1", 0))
    port = srv.info.addresses[0].port
    tracing = Tracing(provider)
    try:
        url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
        async with rpc.connect(
            url, registry=rpc.Registry(), middleware=[tracing], reconnect=False
        ) as peer:
            for i in range(3):
                with provider.get_tracer("app").start_as_current_span("outer"):
                    assert await peer.request("Anything", b"%d" % i, raw=True, timeout=5) == (
                        b"%d" % i
                    )
            await wait_until(lambda: peer.codec.pongs_received >= 1)
            assert peer.codec.last_pong_data == b""  # Hat peers echo nothing
            assert not peer.adapter.metadata and not peer.adapter.cancels
    finally:
        await srv.async_close()
    assert received == ["Anything"] * 3


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_unregistered_ops_share_one_server_span_name(spans: Any, flavour: str) -> None:
    """A peer choosing op names cannot grow the set of server span names: requests and
    notifications no handler is registered for are all ``(unknown)`` (as metrics label
    them), the name sent kept, cut to 128 characters, in ``rpc.peerwire.requested_op``."""
    provider, exporter = spans
    reg = traced_registry(provider)
    noted: list[Any] = []
    reg.handle_notification("noted")(noted.append)
    scheme, query = FLAVOURS[flavour]
    long_op = "o" * 300
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=reg, middleware=[Tracing(provider)]
    ) as server:
        async with rpc.connect(
            f"{server.url}{query}", registry=rpc.Registry(), reconnect=False
        ) as p:
            for op in [f"made-up-{i}" for i in range(5)] + [long_op]:
                with pytest.raises(rpc.RemoteError):
                    await p.request(op, 1)
            for i in range(5):
                p.notify(f"made-up-note-{i}", 1)
            p.notify("noted", 1)
            assert await p.request("work", 1) == 2

            def served() -> list[Any]:
                return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]

            await wait_until(lambda: len(served()) == 13)
    names = {s.name for s in served()}
    assert names == {"(unknown)", "noted", "work"}
    unknown = [s for s in served() if s.name == "(unknown)"]
    assert len(unknown) == 11
    assert {s.attributes["rpc.method"] for s in unknown} == {"(unknown)"}
    requested = {s.attributes["rpc.peerwire.requested_op"] for s in unknown}
    assert "o" * 128 in requested and "made-up-note-4" in requested and "made-up-0" in requested
    assert max(map(len, requested)) == 128
    assert all(
        "rpc.peerwire.requested_op" not in s.attributes for s in served() if s not in unknown
    )

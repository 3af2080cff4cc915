"""OpenTelemetry spans through the Tracing middleware, read back from the SDK's in-memory
exporter: nesting across a peerwire-to-peerwire call, results, and no trace context on the
wire to peers that did not take peerwire's envelope."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import rpc
from rpc.tracing import Tracing
from wire import envelope


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


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


def accept(peer: rpc.Peer) -> None:
    peer.accept_envelope()  # what the connect-time announcement of peerwire peers will do


async def test_spans_nest_across_a_peerwire_call(spans: Any) -> None:
    provider, exporter = spans
    tracing = Tracing(provider)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0",
        registry=traced_registry(provider),
        middleware=[tracing],
        on_connect=accept,
    ) as server:
        async with rpc.connect(
            str(server.url), registry=rpc.Registry(), middleware=[tracing], on_connect=accept
        ) as p:
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
    assert server_span.attributes["rpc.peerwire.protocol"] == "gotalk"
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


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_no_trace_context_without_the_envelope(spans: Any, scheme: str) -> None:
    """A peer that did not take the envelope gets the payload as it is, and the server's
    span starts a trace of its own."""
    provider, exporter = spans
    tracing = Tracing(provider)
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=traced_registry(provider), middleware=[tracing]
    ) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry(), middleware=[tracing]) as p:
            with provider.get_tracer("app").start_as_current_span("outer"):
                assert await p.request("raw", b"exact bytes", raw=True) == b"exact bytes"
    raw_spans = {s.kind: s for s in exporter.get_finished_spans() if s.name == "raw"}
    assert raw_spans[SpanKind.SERVER].parent is None
    client_trace = raw_spans[SpanKind.CLIENT].context.trace_id
    assert raw_spans[SpanKind.SERVER].context.trace_id != client_trace


async def test_enveloped_payloads_reach_handlers_unchanged() -> None:
    """With the envelope on both ends (and no middleware), handlers see the bare payload;
    a payload that is not an envelope is an error result, not a dead connection."""
    reg = rpc.Registry()

    @reg.handle("raw")
    def raw(data: bytes) -> bytes:
        return data

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, on_connect=accept) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry(), on_connect=accept) as peer:
            assert await peer.request("raw", b"\x01\x00abc", raw=True) == b"\x01\x00abc"
        async with rpc.connect(str(server.url), registry=rpc.Registry()) as plain:
            with pytest.raises(rpc.RemoteError, match="envelope"):
                await plain.request("raw", b"\x07", raw=True)
            assert await plain.request("raw", envelope.pack(b"ok", {"k": "v"}), raw=True) == b"ok"


def test_envelope_round_trip_and_malformed() -> None:
    data = envelope.pack(b"payload", {"traceparent": "00-abc-def-01", "k": ""})
    assert envelope.unpack(data) == ({"traceparent": "00-abc-def-01", "k": ""}, b"payload")
    assert envelope.unpack(envelope.pack(b"", None)) == ({}, b"")
    for bad in (b"", b"\x02\x00", b"\x01\x01\x05ab", b"\x01\x01\x01k\x00\x09v", b"\x01\x40"):
        with pytest.raises(envelope.MalformedMessage):
            envelope.unpack(bad)
    with pytest.raises(ValueError):
        envelope.pack(b"", {"": "empty key"})


async def test_chatter_connections_refuse_the_envelope() -> None:
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=rpc.Registry()) as server:
        async with rpc.connect(f"{server.url}?dialect=HatChatter", reconnect=False) as peer:
            with pytest.raises(ValueError, match="Gotalk"):
                peer.accept_envelope()

"""Hunt 146: metrics, tracing and rate-limited logs of peerwire's operating tooling, on
real servers (127.0.0.1, port 0) with the real prometheus-client and OpenTelemetry SDK."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

import rpc
from rpc.metrics import Metrics
from rpc.tracing import Tracing
from tests.rpc_helpers import FLAVOURS, wait_until
from wire.chatter import Dialect, Msg, encode_frame


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_spans_a_streamed_handler_starts_are_children_of_its_server_span(
    spans: Any, flavour: str
) -> None:
    """A generator handler's body runs as the core reads its parts, after the Tracing
    middleware returned: its spans were roots of traces of their own (parent None, another
    trace id), not children of the call's SERVER span as a coroutine handler's are."""
    provider, exporter = spans
    tracer = provider.get_tracer("handlers")
    reg = rpc.Registry()

    @reg.handle("parts")
    async def parts(n: int) -> AsyncIterator[int]:
        for i in range(n):
            with tracer.start_as_current_span(f"part-{i}"):
                await asyncio.sleep(0)
                yield i
        with tracer.start_as_current_span("after-parts"):
            pass

    tracing = Tracing(provider)
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=reg, middleware=[tracing]) as s:
        url = f"{scheme}://127.0.0.1:{s.url.port}{query}"
        async with rpc.connect(
            url, registry=rpc.Registry(), middleware=[tracing], reconnect=False
        ) as peer:
            await wait_until(lambda: peer.adapter.metadata)
            assert [x async for x in peer.stream("parts", value=3)] == [0, 1, 2]
            with tracer.start_as_current_span("client-after"):  # our context is untouched
                pass
    finished = exporter.get_finished_spans()
    [server] = [x for x in finished if x.name == "parts" and x.kind == SpanKind.SERVER]
    inner = [x for x in finished if x.name.startswith(("part-", "after-parts"))]
    assert len(inner) == 4
    for span in inner:
        assert span.parent is not None and span.parent.span_id == server.context.span_id
        assert span.context.trace_id == server.context.trace_id
    [after] = [x for x in finished if x.name == "client-after"]
    assert after.parent is None


class Stop(BaseException):
    """A handler's BaseException that is not an Exception (answered with an error result)."""


async def test_a_handlers_base_exception_is_a_handler_error_not_a_cancel(spans: Any) -> None:
    """A handler's Stop (a BaseException, answered with an error result since c4f8a7e) was
    counted error="cancelled" and its span's result "cancelled" (rpc.middleware.outcome
    took every BaseException that is not an Exception for a cancellation)."""
    provider, exporter = spans
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    reg = rpc.Registry()

    @reg.handle("stop")
    async def stop(_: Any) -> None:
        raise Stop("stopped")

    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, metrics=metrics, middleware=[Tracing(provider)]
    ) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry(), reconnect=False) as p:
            with pytest.raises(rpc.RemoteError, match="stopped"):
                await p.request("stop", 1)
    labels = {"side": "server", "protocol": "gotalk", "op": "stop"}
    errors = "peerwire_errors_total"
    assert registry.get_sample_value(errors, {**labels, "error": "cancelled"}) is None
    assert registry.get_sample_value(errors, {**labels, "error": "handler"}) == 1
    [span] = [x for x in exporter.get_finished_spans() if x.name == "stop"]
    assert span.attributes["rpc.peerwire.result"] == "handler"


async def test_unanswered_pings_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """Chatter peers that send a frame (the dialect is known: pings start) and then never
    answer a ping: each is closed, and each was one WARNING line, past any limit (now
    through the rate-limited violations log)."""
    count = 30
    caplog.set_level(logging.INFO, logger="peerwire")
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=rpc.Registry(), ping_interval=0.2, ping_timeout=0.2
    ) as server:
        writers = []
        try:
            for _ in range(count):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
                writer.write(encode_frame(Msg(1, 1, True, True, True, "hi", b""), Dialect.CURRENT))
                writers.append((reader, writer))
            for reader, _ in writers:  # every one closed by the server for its silence
                async with asyncio.timeout(10):
                    while await reader.read(65536):
                        pass
        finally:
            for _, writer in writers:
                writer.close()
    unanswered = [
        r for r in caplog.records if r.levelno >= logging.WARNING and "ping" in r.getMessage()
    ]
    assert unanswered, "no ping warning at all: the test saw nothing"
    assert len(unanswered) <= 21  # a burst of 20, and the line saying how many were left out

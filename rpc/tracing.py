"""OpenTelemetry spans for peerwire calls (the ``otel`` extra: ``opentelemetry-api``).

    rpc.serve(url, middleware=[Tracing()])     # a SERVER span per call served
    rpc.connect(url, middleware=[Tracing()])   # a CLIENT span per request sent (per attempt)

Spans are named after the op (:func:`rpc.middleware.op_name`: a served op no handler is
registered for is ``(unknown)``, so a peer cannot grow the set of span names; the name it
sent, cut to :data:`~rpc.middleware.MAX_OP_NAME` (128) characters, is then the attribute
``rpc.peerwire.requested_op``) and carry ``rpc.system`` (``peerwire``), ``rpc.method`` (the
span's name), ``rpc.peerwire.protocol``, ``rpc.peerwire.kind``, ``network.peer.address``
and ``.port``, and ``rpc.peerwire.result`` (``ok``, ``retry`` or the kind of error, as in
:mod:`rpc.metrics`); errors also set the span's status. A streamed result's span ends after
its last part; a served one's parts are made in its span's context (spans a generator
handler starts are its children).

Trace context travels between peerwire peers only, in ``Call.metadata`` (W3C
``traceparent``/``tracestate`` through OpenTelemetry's configured propagator), which goes
out as peerwire's request metadata (:mod:`wire.metadata`): a client injects it only on
connections whose peer took request metadata at connect (extension level 2), so Go,
gotalk.js and Hat peers never get it; a server span continues the trace it receives, or
starts one. Requests sent before the peer's answer to the announcement arrived (about one
round trip after connecting) carry none.
Spans go wherever the application's tracer provider sends them (the API alone records none).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from rpc.middleware import MAX_OP_NAME, UNKNOWN_OP, Call, CallNext, on_finish, op_name, outcome

_EMPTY = otel_context.Context()


def inject_context(metadata: MutableMapping[str, str]) -> None:
    """Put the current trace context into a call's metadata (for a peerwire peer)."""
    propagate.inject(metadata)


def extract_context(metadata: Mapping[str, str]) -> otel_context.Context:
    """The trace context a peerwire peer sent in a call's metadata (an empty context, so a
    new trace, when it sent none)."""
    if not metadata:
        return _EMPTY
    return propagate.extract(metadata, context=_EMPTY)


class Tracing:
    """Middleware: one span per call, on both sides (see the module doc)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("peerwire", tracer_provider=tracer_provider)

    async def __call__(self, call: Call, call_next: CallNext) -> Any:
        server = call.side == "server"
        name = op_name(call)
        span = self._tracer.start_span(
            name,
            context=extract_context(call.metadata) if server else None,
            kind=SpanKind.SERVER if server else SpanKind.CLIENT,
            attributes=_attributes(call, name),
        )
        current = trace.set_span_in_context(span)
        token = otel_context.attach(current)
        try:
            if not server and call.peer.adapter.metadata:
                inject_context(call.metadata)
            result = await call_next(call)
        except BaseException as exc:
            _end(span, call.side, exc)
            raise
        finally:
            otel_context.detach(token)
        if server and inspect.isasyncgen(result):
            result = _in_span(result, current)
        return on_finish(result, lambda error: _end(span, call.side, error))


async def _in_span(parts: AsyncGenerator[Any, Any], current: otel_context.Context) -> Any:
    """A served streamed result whose every step (and its close) runs in ``current``, the
    context of the call's span, as its handler's steps run past the middleware's return:
    spans a generator handler starts are children of the call's, not traces of their own.
    Attached per step, never across a yield: the consumer (the core) sees its own context."""
    try:
        while True:
            token = otel_context.attach(current)
            try:
                part = await anext(parts)
            except StopAsyncIteration:
                return
            finally:
                otel_context.detach(token)
            yield part
    finally:
        token = otel_context.attach(current)
        try:
            await parts.aclose()
        finally:
            otel_context.detach(token)


def _attributes(call: Call, name: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "rpc.system": "peerwire",
        "rpc.method": name,
        "rpc.peerwire.protocol": call.protocol,
        "rpc.peerwire.kind": call.kind,
    }
    if name == UNKNOWN_OP:
        attributes["rpc.peerwire.requested_op"] = call.op[:MAX_OP_NAME]
    address = call.address
    if isinstance(address, tuple) and len(address) >= 2:
        attributes["network.peer.address"] = str(address[0])
        attributes["network.peer.port"] = int(address[1])
    return attributes


def _end(span: Span, side: str, error: BaseException | None) -> None:
    result = outcome(error, side)
    span.set_attribute("rpc.peerwire.result", result)
    if result not in ("ok", "retry"):
        if isinstance(error, Exception):
            span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{result}: {error}"))
    span.end()

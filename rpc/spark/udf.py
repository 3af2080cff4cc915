"""Calling remote peers from a DataFrame: :func:`call` (a column) and :func:`call_frame`.

    from rpc import spark as pws
    df = df.withColumn("greeting", pws.call("tcp+gotalk://10.0.0.5:4000", "greet", "name"))
    df.select("greeting.result", "greeting.error")

Every Python worker keeps one connection per URL and pipelines each Arrow batch over it
(see :mod:`rpc.spark.worker`); each row makes exactly one call (more only when the op is
marked idempotent and a retry is due).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql.types import DataType

from rpc.spark.frames import ResultShape, column_function, input_column, map_frame, parse_type
from rpc.spark.worker import CallPolicy, Endpoint, Pipeline, Tls, make_caller, runtime
from rpc.url import parse_url


@dataclass(frozen=True, slots=True)
class RemoteCalls:
    """The evaluator of :func:`call`: travels to executors, opens a pipeline there."""

    endpoint: Endpoint
    policy: CallPolicy
    window: int

    def open(self) -> Pipeline:
        rt = runtime()
        return Pipeline(rt, make_caller(rt.pool, self.endpoint, self.policy), self.window)


def _setup(
    url: str,
    op: str,
    *,
    result_type: DataType | str | None,
    timeout: float | None,
    idempotent: bool,
    retries: int,
    backoff: float,
    max_in_flight: int,
    on_error: str,
    tls: Tls | None,
    connect_timeout: float,
    protocol_options: Mapping[str, Any] | None,
) -> tuple[RemoteCalls, ResultShape]:
    parse_url(url)  # a bad URL fails here, on the driver, not in every task
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    if retries < 0 or backoff < 0:
        raise ValueError("retries and backoff must not be negative")
    endpoint = Endpoint(url, tls, connect_timeout, tuple(sorted((protocol_options or {}).items())))
    policy = CallPolicy(op, timeout, idempotent, retries, backoff)
    shape = ResultShape(parse_type(result_type), on_error, what=f"call {op!r}")
    return RemoteCalls(endpoint, policy, max_in_flight), shape


def call(
    url: str,
    op: str,
    *cols: Column | str,
    result_type: DataType | str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    retries: int = 3,
    backoff: float = 0.2,
    max_in_flight: int = 128,
    on_error: str = "null",
    tls: Tls | None = None,
    connect_timeout: float = 10.0,
    protocol_options: Mapping[str, Any] | None = None,
) -> Column:
    """A column with the result of calling ``op`` on the peer at ``url`` once per row.

    The request is the value of the one column given, or an object keyed by the column
    names when several are given (JSON-able values; a binary column alone is sent as raw
    bytes). The column is ``struct<result, error>``: ``result`` is the JSON text of the
    result (or a value of ``result_type``, a DataType or DDL string, e.g. ``"double"`` or
    ``"label string, score double"``), ``error`` is null or ``"ErrorType: message"``.
    ``on_error="raise"`` fails the Spark task at the first error instead.

    ``timeout`` bounds each attempt (None = the protocol's default: Chatter 5 s, Gotalk
    30 s). Only ``idempotent`` ops are retried, up to ``retries`` times, after a retry
    result or a lost connection, waiting ``backoff`` seconds doubled each time (or the
    peer's retry wait, when longer). ``max_in_flight`` bounds each Python worker's
    outstanding calls. ``tls`` gives files for ``ssl+`` URLs (read on the executors);
    ``protocol_options`` go to the protocol peer (``ping_interval``, ...).
    """
    evaluator, shape = _setup(
        url,
        op,
        result_type=result_type,
        timeout=timeout,
        idempotent=idempotent,
        retries=retries,
        backoff=backoff,
        max_in_flight=max_in_flight,
        on_error=on_error,
        tls=tls,
        connect_timeout=connect_timeout,
        protocol_options=protocol_options,
    )
    return column_function(evaluator, shape)(input_column(cols)).alias(op)


def call_frame(
    df: DataFrame,
    url: str,
    op: str,
    *cols: Column | str,
    into: str = "rpc",
    result_type: DataType | str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    retries: int = 3,
    backoff: float = 0.2,
    max_in_flight: int = 128,
    on_error: str = "null",
    tls: Tls | None = None,
    connect_timeout: float = 10.0,
    protocol_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """``df`` with a ``struct<result, error>`` column ``into`` holding ``op``'s result for
    each row, computed with ``mapInArrow`` (all other columns kept). Options as in
    :func:`call`."""
    evaluator, shape = _setup(
        url,
        op,
        result_type=result_type,
        timeout=timeout,
        idempotent=idempotent,
        retries=retries,
        backoff=backoff,
        max_in_flight=max_in_flight,
        on_error=on_error,
        tls=tls,
        connect_timeout=connect_timeout,
        protocol_options=protocol_options,
    )
    return map_frame(df, input_column(cols), into, evaluator, shape)

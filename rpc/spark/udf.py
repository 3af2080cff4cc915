"""Calling remote peers from a DataFrame: :func:`call` (a column) and :func:`call_frame`.

    from rpc import spark as pws
    df = df.withColumn("greeting", pws.call("tcp+gotalk://10.0.0.5:4000", "greet", "name"))
    df.select("greeting.result", "greeting.error")

Every Python worker keeps one connection per URL and pipelines each Arrow batch over it
(see :mod:`rpc.spark.worker`); each row makes one call, sent again only when that is safe
(it was never sent, the peer asked for a retry, or the op is idempotent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Column, DataFrame
from pyspark.sql.types import DataType

from rpc.spark.frames import (
    ResultShape,
    SparkCallError,
    column_function,
    input_column,
    map_frame,
    parse_type,
    udf_name,
)
from rpc.spark.stats import CallStats
from rpc.spark.worker import CallPolicy, Endpoint, Pipeline, Tally, Tls, make_caller, runtime
from rpc.url import parse_url


@dataclass(frozen=True, slots=True)
class RemoteCalls:
    """The evaluator of :func:`call`: travels to executors, opens a pipeline there."""

    endpoint: Endpoint
    policy: CallPolicy
    window: int
    first_attempt_only: bool
    """``on_error="raise"``: a re-run of a task fails at once instead of calling again."""

    def open(self) -> Pipeline:
        if self.first_attempt_only:
            context = TaskContext.get()
            attempt = context.attemptNumber() if context is not None else 0
            if attempt > 0:
                raise SparkCallError(
                    f"call {self.policy.op!r}: not calling the peer again in attempt "
                    f"{attempt + 1} of this task: with on_error='raise' a task runs its calls "
                    "once (the first attempt's error, in the stage's failed tasks, names the "
                    "row)"
                )
        rt = runtime()
        tally = Tally()
        caller = make_caller(rt.pool, self.endpoint, self.policy, tally)
        return Pipeline(rt, caller, self.window, tally)


def _setup(
    url: str,
    op: str,
    *,
    result_type: DataType | str | None,
    timeout: float | None,
    idempotent: bool,
    retry_for: float,
    retries: int | None,
    backoff: float,
    max_in_flight: int,
    on_error: str,
    key: str | None,
    tls: Tls | None,
    connect_timeout: float,
    protocol_options: Mapping[str, Any] | None,
) -> tuple[RemoteCalls, ResultShape]:
    parse_url(url)  # a bad URL fails here, on the driver, not in every task
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    if retry_for < 0 or backoff < 0 or (retries is not None and retries < 0):
        raise ValueError("retry_for, retries and backoff must not be negative")
    endpoint = Endpoint(url, tls, connect_timeout, tuple(sorted((protocol_options or {}).items())))
    policy = CallPolicy(op, timeout, idempotent, retry_for, retries, backoff)
    shape = ResultShape(parse_type(result_type), on_error, what=f"call {op!r}", key=key)
    return RemoteCalls(endpoint, policy, max_in_flight, on_error == "raise"), shape


def call(
    url: str,
    op: str,
    *cols: Column | str,
    result_type: DataType | str | None = None,
    request: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    retry_for: float = 30.0,
    retries: int | None = None,
    backoff: float = 0.2,
    max_in_flight: int = 128,
    on_error: str = "null",
    key: str | None = None,
    stats: CallStats | None = None,
    tls: Tls | None = None,
    connect_timeout: float = 10.0,
    protocol_options: Mapping[str, Any] | None = None,
) -> Column:
    """A column with the result of calling ``op`` on the peer at ``url`` once per row.

    The request is the value of the one column given, or an object keyed by the column
    names when several are given (``request="value"`` / ``"object"`` fixes the shape;
    JSON-able values; a binary column alone is sent as raw bytes). The column is
    ``struct<result, error>``: ``result`` is the JSON text of the result (SQL NULL for a
    null result) or a value of ``result_type`` (a DataType or DDL string, e.g. ``"double"``
    or ``"label string, score double"``); ``error`` is null or ``"ErrorType: message"``.

    ``on_error="raise"`` fails the Spark task at the first error, naming the row by its
    request value or its ``key`` column's value; a re-run of that task (Spark retries failed
    tasks) fails at once without calling the peer again.

    Peer restarts: a request not sent yet waits for the peer (reconnecting with back-off)
    for up to ``retry_for`` seconds (counted from the row's start or the outage's, if
    earlier); a call in flight when the connection died fails, unless the op is
    ``idempotent``: then it is sent again within the same budget. Retry results are
    honoured for any op (the peer did not run the request), waiting ``backoff`` seconds
    doubled each time with jitter (or the peer's wait, when longer); ``retries`` caps the
    resends per row. Error results and timeouts are never resent.

    ``timeout`` bounds each attempt (None = the protocol's default: Chatter 5 s, Gotalk
    30 s). ``max_in_flight`` bounds each Python worker's outstanding calls. ``stats``
    counts calls, errors and resends (a :class:`CallStats`, classic sessions). ``tls``
    gives files for ``ssl+`` URLs (read on the executors); ``protocol_options`` go to the
    protocol peer (``ping_interval``, ...).
    """
    evaluator, shape = _setup(
        url,
        op,
        result_type=result_type,
        timeout=timeout,
        idempotent=idempotent,
        retry_for=retry_for,
        retries=retries,
        backoff=backoff,
        max_in_flight=max_in_flight,
        on_error=on_error,
        key=key,
        tls=tls,
        connect_timeout=connect_timeout,
        protocol_options=protocol_options,
    )
    source = input_column(cols, request, key)
    name = udf_name("call", op)
    return column_function(evaluator, shape, source, name, stats).alias(op)


def call_frame(
    df: DataFrame,
    url: str,
    op: str,
    *cols: Column | str,
    into: str = "rpc",
    result_type: DataType | str | None = None,
    request: str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    retry_for: float = 30.0,
    retries: int | None = None,
    backoff: float = 0.2,
    max_in_flight: int = 128,
    on_error: str = "null",
    key: str | None = None,
    stats: CallStats | None = None,
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
        retry_for=retry_for,
        retries=retries,
        backoff=backoff,
        max_in_flight=max_in_flight,
        on_error=on_error,
        key=key,
        tls=tls,
        connect_timeout=connect_timeout,
        protocol_options=protocol_options,
    )
    source = input_column(cols, request, key)
    return map_frame(df, source, into, evaluator, shape, udf_name("call", op), stats)

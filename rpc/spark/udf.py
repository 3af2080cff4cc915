"""Calling remote peers from a DataFrame: :func:`call` (a column) and :func:`call_frame`.

    from rpc import spark as pws
    df = df.withColumn("greeting", pws.call("tcp+gotalk://10.0.0.5:4000", "greet", "name"))
    df.select("greeting.result", "greeting.error")

Every Python worker keeps one connection per URL (at most ``max_connections``, default 64)
and pipelines each Arrow batch over it (see :mod:`rpc.spark.worker`); each row makes one
call, sent again only when that is safe (it was never sent, the peer asked for a retry, or
the op is idempotent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Column, DataFrame

from rpc.spark.frames import (
    ResultShape,
    SparkCallError,
    column_function,
    input_column,
    map_frame,
    parse_type,
    udf_name,
)
from rpc.spark.options import CallOptions
from rpc.spark.pool import Endpoint
from rpc.spark.worker import CallPolicy, Pipeline, Tally, make_caller, runtime
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


def _setup(url: str, op: str, options: CallOptions) -> tuple[RemoteCalls, ResultShape]:
    parse_url(url)  # a bad URL fails here, on the driver, not in every task
    o = options
    endpoint = Endpoint(
        url, o.tls, o.connect_timeout, tuple(sorted((o.protocol_options or {}).items()))
    )
    policy = CallPolicy(
        op,
        o.timeout,
        o.idempotent,
        o.retry_for,
        o.retries,
        o.backoff,
        max_connections=o.max_connections,
    )
    shape = ResultShape(parse_type(o.result_type), o.on_error, what=f"call {op!r}", key=o.key)
    return RemoteCalls(endpoint, policy, o.max_in_flight, o.on_error == "raise"), shape


def call(
    url: str,
    op: str,
    *cols: Column | str,
    options: CallOptions | None = None,
    **keywords: Any,
) -> Column:
    """A column with the result of calling ``op`` on the peer at ``url`` once per row.

    Options are a :class:`~rpc.spark.options.CallOptions` or its fields as keywords.

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
    30 s). ``max_in_flight`` bounds each Python worker's outstanding calls and
    ``max_connections`` (default 64) its connections, one per URL: a new one closes the
    least recently used one with no call in flight (when all have, the row waits for one
    within ``retry_for``, then fails with ``PoolFull``). ``stats``
    counts calls, errors and resends (a :class:`CallStats`, classic sessions). ``tls``
    gives files for ``ssl+`` URLs (read on the executors); ``protocol_options`` go to the
    protocol peer (``ping_interval``, ...). ``into`` is for :func:`call_frame` only.
    """
    if "into" in keywords:
        raise TypeError("call() names its column after the op: into= is for call_frame()")
    o = CallOptions.of(options, keywords)
    evaluator, shape = _setup(url, op, o)
    source = input_column(cols, o.request, o.key)
    return column_function(evaluator, shape, source, udf_name("call", op), o.stats).alias(op)


def call_frame(
    df: DataFrame,
    url: str,
    op: str,
    *cols: Column | str,
    options: CallOptions | None = None,
    **keywords: Any,
) -> DataFrame:
    """``df`` with a ``struct<result, error>`` column ``into`` (default ``"rpc"``) holding
    ``op``'s result for each row, computed with ``mapInArrow`` (all other columns kept).
    Options as in :func:`call`."""
    o = CallOptions.of(options, keywords)
    evaluator, shape = _setup(url, op, o)
    source = input_column(cols, o.request, o.key)
    return map_frame(df, source, o.into, evaluator, shape, udf_name("call", op), o.stats)

"""peerwire on Apache Spark: call remote peers from DataFrames, run handlers on executors.

Needs the ``spark`` extra (``pip install 'peerwire[spark]'``: PySpark >= 4.1 with Arrow).

- :func:`call` / :func:`call_frame`: a ``struct<result, error>`` column from calling an op
  on a peer once per row, pipelined over one connection per Python worker.
- :func:`apply` / :func:`apply_frame`: a registry's handler run over a column on the
  executors, no network involved.
- :class:`SparkBatcher` / :func:`serve_op`: a peerwire op whose requests are batched into
  Spark jobs.
- :class:`CallOptions` / :class:`ApplyOptions`: their options as one frozen object (the
  functions take the same names as keywords too).
- :class:`CallStats`: rows called, failed and resent per UDF (an accumulator).
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("rpc.spark needs PySpark and PyArrow: pip install 'peerwire[spark]'") from exc

from rpc.spark.apply import apply, apply_frame, ship_by_value
from rpc.spark.frames import SparkCallError
from rpc.spark.options import ApplyOptions, CallOptions
from rpc.spark.pool import Tls
from rpc.spark.serving import ROW_ID, SparkBatcher, serve_op
from rpc.spark.stats import CallStats
from rpc.spark.udf import call, call_frame

__all__ = [
    "ROW_ID",
    "ApplyOptions",
    "CallOptions",
    "CallStats",
    "SparkBatcher",
    "SparkCallError",
    "Tls",
    "apply",
    "apply_frame",
    "call",
    "call_frame",
    "serve_op",
    "ship_by_value",
]

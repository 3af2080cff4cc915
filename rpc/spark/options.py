"""The options of :func:`~rpc.spark.call` / :func:`~rpc.spark.call_frame` and
:func:`~rpc.spark.apply` / :func:`~rpc.spark.apply_frame`, each set as one frozen object.

    opts = pws.CallOptions(result_type="double", timeout=2.0, idempotent=True)
    df.withColumn("s", pws.call(url, "score", "x", options=opts))

The functions also take the same names as keyword arguments (then they build the object,
or override fields of a given one), so ``pws.call(url, "score", "x", timeout=2.0)`` and
``options=pws.CallOptions(timeout=2.0)`` are the same call. Values are checked when the
object is built, on the driver.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pyspark.sql.types import DataType

from rpc.spark.frames import ON_ERROR, REQUEST_SHAPES
from rpc.spark.pool import MAX_CONNECTIONS, Tls
from rpc.spark.stats import CallStats

DEFAULT_INTO = "rpc"
"""The column ``call_frame`` and ``apply_frame`` add when ``into`` is not given (for both;
``apply_frame`` used to add ``"result"``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameOptions:
    """What every column of peerwire results takes."""

    result_type: DataType | str | None = None
    """The ``result`` field's type (a DataType or DDL string); None: the result's JSON text."""
    request: str | None = None
    """``"value"`` or ``"object"`` fixes the request's shape; None: a value for one input
    column, an object keyed by the column names for several."""
    on_error: str = "null"
    """``"null"``: a failed row gets its ``error`` field; ``"raise"``: the task fails."""
    key: str | None = None
    """A column whose value names a failed row in ``on_error="raise"`` errors."""
    stats: CallStats | None = None
    """Counts rows, errors and resends per UDF (classic sessions)."""
    into: str = DEFAULT_INTO
    """The column the ``*_frame`` functions add (ignored by ``call`` / ``apply``, whose
    column is named after the op)."""

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if self.request is not None and self.request not in REQUEST_SHAPES:
            raise ValueError(f"request must be one of {REQUEST_SHAPES}, not {self.request!r}")

    @classmethod
    def of(cls, options: Self | None, keywords: Mapping[str, Any]) -> Self:
        """``options`` (or the defaults) with ``keywords`` set; TypeError for unknown names."""
        if options is None:
            return cls(**keywords)
        if not isinstance(options, cls):
            raise TypeError(f"options must be a {cls.__name__}, not {type(options).__name__}")
        return dataclasses.replace(options, **keywords) if keywords else options


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions(FrameOptions):
    """How :func:`~rpc.spark.call` / :func:`~rpc.spark.call_frame` call the peer."""

    timeout: float | None = None
    """Seconds each attempt waits (None: the protocol's default, Chatter 5 s, Gotalk 30 s)."""
    idempotent: bool = False
    """Calls in flight when their connection died are sent again only for idempotent ops."""
    retry_for: float = 30.0
    """Seconds a row may spend waiting for the peer (reconnecting) and resending."""
    retries: int | None = None
    """At most this many resends per row (None: as many as ``retry_for`` allows)."""
    backoff: float = 0.2
    """First wait before a resend, doubled each time, with jitter."""
    max_in_flight: int = 128
    """Outstanding calls per Python worker."""
    max_connections: int = MAX_CONNECTIONS
    """Connections a Python worker keeps (one per URL and TLS/connect settings, shared by the
    UDFs it runs): a new one first closes the least recently used one with no call on it."""
    tls: Tls | None = None
    """Files for ``ssl+`` URLs, read on the executors."""
    connect_timeout: float = 10.0
    """Seconds connecting may take."""
    protocol_options: Mapping[str, Any] | None = None
    """Keyword arguments of the protocol peer (``ping_interval``, ...)."""

    def __post_init__(self) -> None:
        super(CallOptions, self).__post_init__()  # (slots: no zero-argument super)
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.timeout is not None and not _positive(self.timeout):
            raise ValueError(
                f"timeout must be a positive number of seconds or None: {self.timeout!r}"
            )
        if not _positive(self.connect_timeout):
            raise ValueError(f"connect_timeout must be positive: {self.connect_timeout!r}")
        if not (math.isfinite(self.retry_for) and math.isfinite(self.backoff)):
            raise ValueError("retry_for and backoff must be finite")
        if min(self.retry_for, self.backoff, self.retries or 0) < 0:
            raise ValueError("retry_for, retries and backoff must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyOptions(FrameOptions):
    """How :func:`~rpc.spark.apply` / :func:`~rpc.spark.apply_frame` run the handler."""

    max_concurrency: int = 64
    """Coroutine handlers running at once per Python worker."""

    def __post_init__(self) -> None:
        super(ApplyOptions, self).__post_init__()  # (slots: no zero-argument super)
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")


def _positive(seconds: float) -> bool:
    """A finite number of seconds above 0 (NaN and infinity are not)."""
    return math.isfinite(seconds) and seconds > 0

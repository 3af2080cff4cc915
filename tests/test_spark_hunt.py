"""Defect hunt: rpc.spark under the conditions of real deployments (local[2], peers on
127.0.0.1): option values docs/spark.md says fail when built, a SparkBatcher bound that
freezes the server's loop, and a new Chatter connection that never answers taken as proven
(its probe's timeout ends the outage, so every row is sent into the void)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pyspark.sql import SparkSession

from rpc import spark as pws
from tests.spark_session import (  # noqa: F401
    ONE_SPARK_AT_A_TIME,
    spark_fixture,
)

pytestmark = [ONE_SPARK_AT_A_TIME, pytest.mark.timeout(120)]

# --- options: "Bad values fail when the object is built, on the driver" --------------------


@pytest.mark.parametrize(
    "keywords",
    [
        {"timeout": -1.0},
        {"timeout": 0.0},
        {"connect_timeout": -1.0},
        {"retry_for": math.nan},
        {"on_error": "rasie"},
        {"request": "objects"},
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_bad_call_options_fail_when_built(keywords: dict[str, Any]) -> None:
    """docs/spark.md: "Bad values fail when the object is built, on the driver". A negative
    or zero timeout makes every row fail with 'no result within -1.0 s'; a negative
    connect_timeout makes every row wait retry_for (30 s) and fail 'timed out'; a NaN
    retry_for makes every row 'ValueError: cannot convert float NaN to integer'; typos in
    on_error / request are caught only later, by call()."""
    with pytest.raises((ValueError, TypeError)):
        pws.CallOptions(**keywords)


def test_bad_apply_options_fail_when_built() -> None:
    with pytest.raises(ValueError):
        pws.ApplyOptions(on_error="rasie")


# --- serving: SparkBatcher's bounds --------------------------------------------------------


@pytest.mark.parametrize("max_batch", [0, -1])
def test_spark_batcher_rejects_a_batch_bound_below_one(spark: SparkSession, max_batch: int) -> None:
    """With max_batch=0 the first request spins the batcher's runner for good: each turn
    takes no request (``self._queue[:0]``), skips the gathering sleep (``len < 0``) and
    ``continue``s without awaiting, so the server's event loop freezes at 100 % CPU and no
    connection is served again. Like job_timeout, it must fail when the batcher is built."""
    with pytest.raises(ValueError, match="max_batch"):
        pws.SparkBatcher(spark, lambda df: df, "x double", max_batch=max_batch)

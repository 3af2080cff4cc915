"""Serving mode: a Spark job that runs past ``job_timeout`` is cancelled, its batch's
requests fail with a timeout error, and the next batch's job answers the requests that
waited behind it (before, one stuck job held the op for good)."""

from __future__ import annotations

import asyncio
import time

import pytest
from pyspark import StatusTracker
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import rpc
from rpc import spark as pws
from tests.rpc_helpers import wait_until
from tests.spark_session import (  # noqa: F401
    ONE_SPARK_AT_A_TIME,
    loop_thread_fixture,
    serve_peer_fixture,
    spark_fixture,
)

pytestmark = ONE_SPARK_AT_A_TIME

STUCK = 600.0
"""How long the handler sleeps for a negative x: far past the test, so only cancelling the
job ends it."""

model = rpc.Registry()


@model.handle("double")
def double(x: float) -> float:
    """Runs on the executors; a negative x is a job that never ends."""
    if x < 0:
        time.sleep(STUCK)
    return x * 2


def double_job(df: DataFrame) -> DataFrame:
    doubled = pws.apply_frame(df, model, "double", "x", into="d", result_type="double")
    return doubled.select(pws.ROW_ID, F.col("d.result").alias("y"))


def running_tasks(tracker: StatusTracker) -> int:
    return sum(executor.numRunningTasks for executor in tracker.getExecutorInfos())


@pytest.mark.timeout(240)  # Spark's start (up to ~45 s), the 20 s job_timeout, the rest
def test_a_stuck_job_is_cancelled_at_job_timeout_and_the_next_batch_runs(
    spark: SparkSession, serve_peer
) -> None:
    # job_timeout bounds every job, the follow-up's too: that one took 2-6 s on a loaded
    # 2-core machine (where 5 s failed it in 6 of 6 runs), as the stuck one's worker dies
    timeout = 20.0
    # the session's first Python job (worker start-up) ran past 20 s there: a warm-up of
    # the same job, outside the batcher, before any job_timeout runs
    warm = spark.createDataFrame([(0, 1.0), (1, 2.0)], f"{pws.ROW_ID} long, x double")
    assert sorted(row.y for row in double_job(warm).collect()) == [2.0, 4.0]
    batcher = pws.SparkBatcher(
        spark, double_job, "x double", result="y", max_batch=2, max_wait=0.5, job_timeout=timeout
    )
    registry = rpc.Registry()
    pws.serve_op(registry, "double", batcher)
    url = serve_peer("gotalk", registry).url
    tracker = spark.sparkContext.statusTracker()

    async def client() -> tuple[list[object], float, float]:
        async with rpc.connect(url) as peer:
            started = time.monotonic()
            # one batch of two (max_batch), the stuck one among them; the third request
            # waits for the next batch
            stuck = [
                asyncio.create_task(peer.request("double", {"x": x}, timeout=60))
                for x in (-1.0, 2.0)
            ]
            follow_up = asyncio.create_task(peer.request("double", {"x": 5.0}, timeout=60))
            failed = await asyncio.gather(*stuck, return_exceptions=True)
            failed_after = time.monotonic() - started
            answer = await follow_up
            # the stuck job was cancelled and its task killed, not left running for STUCK s
            await wait_until(lambda: not tracker.getActiveJobsIds(), timeout=10)
            await wait_until(lambda: running_tasks(tracker) == 0, timeout=15)
            return [*failed, answer], failed_after, time.monotonic() - started

    (first, second, answer), failed_after, elapsed = asyncio.run(client())
    message = f"Spark job timed out after {timeout:g} s (cancelled)"
    assert isinstance(first, rpc.RemoteError) and str(first) == message
    assert isinstance(second, rpc.RemoteError) and str(second) == message
    assert answer == 10.0
    assert timeout <= failed_after < timeout + 5
    assert elapsed < 2 * timeout + 10
    assert (batcher.timeouts, batcher.jobs, batcher.answered) == (1, 1, 3)

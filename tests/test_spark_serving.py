"""Serving mode: a peerwire server whose ``score`` op batches concurrent requests into
Spark jobs, whose work (a registry handler) runs on the executors."""

from __future__ import annotations

import asyncio

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import rpc
from rpc import spark as pws
from tests.spark_session import (  # noqa: F401
    ONE_SPARK_AT_A_TIME,
    loop_thread_fixture,
    serve_peer_fixture,
    spark_fixture,
)

pytestmark = ONE_SPARK_AT_A_TIME

model = rpc.Registry()


@model.handle("score")
def score(features: dict[str, object]) -> float:
    """The "model": runs on the executors, inside the Spark jobs."""
    if features["x"] == 13:
        raise ValueError("unlucky")
    return float(features["x"]) * 2 + len(str(features["name"]))


def score_job(df: DataFrame) -> DataFrame:
    scored = pws.apply_frame(
        df.repartition(2), model, "score", "name", "x", into="s", result_type="double"
    )
    return scored.select(pws.ROW_ID, F.col("s.result").alias("score"), F.col("s.error"))


@pytest.mark.parametrize("flavour", ["gotalk", "chatter"])
def test_requests_are_answered_by_batched_spark_jobs(
    spark: SparkSession, serve_peer, flavour: str
) -> None:
    batcher = pws.SparkBatcher(spark, score_job, "name string, x double", max_wait=0.05)
    registry = rpc.Registry()
    pws.serve_op(registry, "score", batcher)

    def broken_job(df: DataFrame) -> DataFrame:
        raise ValueError("model not loaded")

    pws.serve_op(registry, "broken", pws.SparkBatcher(spark, broken_job, "x double"))
    url = serve_peer(flavour, registry).url
    n = 300

    async def client() -> list[object]:
        async with rpc.connect(url) as peer:
            requests = [
                peer.request("score", {"name": f"n{i}", "x": i}, timeout=120) for i in range(n)
            ]
            results = await asyncio.gather(*requests)
            with pytest.raises(rpc.RemoteError, match="does not fit"):
                await peer.request("score", {"name": "a", "x": "lots"}, timeout=120)
            with pytest.raises(rpc.RemoteError, match="unknown fields"):
                await peer.request("score", {"nmae": "a"}, timeout=120)
            failed = await asyncio.gather(
                *(peer.request("broken", {"x": i}, timeout=120) for i in range(3)),
                return_exceptions=True,
            )
            assert [str(e) for e in failed] == [
                "Spark job failed: ValueError: model not loaded"
            ] * 3
            return results

    results = asyncio.run(client())
    for i, result in enumerate(results):
        expected = None if i == 13 else i * 2 + len(f"n{i}")
        error = "ValueError: unlucky" if i == 13 else None
        assert result == {"score": expected, "error": error}
    assert batcher.answered == n + 1  # and the one that did not fit the schema
    assert 1 <= batcher.jobs <= 10  # hundreds of requests, a handful of Spark jobs

"""rpc.spark.apply / apply_frame: a registry's handlers run on the executors (sync inline,
async on the worker loop with a bound), per-row errors, typed results, and the two ways
handler code reaches executors (imported by path, pickled by value)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import rpc
from rpc import spark as pws
from tests.spark_session import ONE_SPARK_AT_A_TIME, spark_fixture  # noqa: F401

pytestmark = ONE_SPARK_AT_A_TIME


@dataclass
class Item:
    name: str
    qty: int


def shop() -> rpc.Registry:
    registry = rpc.Registry()

    @registry.handle("price")
    def price(item: Item) -> dict[str, object]:
        if item.qty < 0:
            raise ValueError("negative quantity")
        return {"total": item.qty * 1.5, "label": item.name.upper()}

    return registry


def test_sync_handler_results_errors_and_types(spark: SparkSession) -> None:
    registry = shop()
    df = spark.createDataFrame([("a", 1), ("b", -1), ("c", 3)], "name string, qty int")
    rows = {
        r.name: r
        for r in df.select(
            "name",
            pws.apply(
                registry, "price", "name", "qty", result_type="total double, label string"
            ).alias("typed"),
            pws.apply(registry, "price", "name", "qty").alias("json"),
            pws.apply(registry, "price", "name").alias("bad"),  # qty missing
        ).collect()
    }
    assert rows["a"].typed.result.asDict() == {"total": 1.5, "label": "A"}
    assert rows["c"].typed.result.asDict() == {"total": 4.5, "label": "C"}
    assert json.loads(rows["c"].json.result) == {"total": 4.5, "label": "C"}
    assert (rows["b"].typed.result, rows["b"].typed.error) == (
        None,
        "ValueError: negative quantity",
    )
    assert rows["b"].json.error == "ValueError: negative quantity"
    for row in rows.values():
        assert row.bad.result is None
        assert row.bad.error.startswith("PayloadError: invalid parameters: Expected `object`")

    out = pws.apply_frame(df, registry, "price", "name", "qty", into="p", result_type="double")
    assert out.columns == ["name", "qty", "p"]
    by_name = {r.name: (r.qty, r.p.result, r.p.error) for r in out.collect()}
    # a dict does not fit "double": a per-row error, not a failed job
    assert by_name["b"] == (-1, None, "ValueError: negative quantity")
    assert by_name["a"][2].startswith("TypeError: result {'total': 1.5, 'label': 'A'}")


def test_async_handlers_run_concurrently_within_the_bound(spark: SparkSession) -> None:
    registry = rpc.Registry()
    state = {"active": 0}

    @registry.handle("slow_square")
    async def slow_square(n: int) -> dict[str, int]:
        state["active"] += 1
        seen = state["active"]
        await asyncio.sleep(0.01)  # the handler's work: calls overlap meanwhile (not a wait)
        state["active"] -= 1
        if n == 13:
            raise KeyError(n)
        return {"square": n * n, "seen": seen}

    @registry.handle("digits")
    async def digits(n: int) -> AsyncIterator[int]:
        for c in str(n):
            yield int(c)

    df = spark.range(0, 200, numPartitions=2)
    rows = df.select(
        "id",
        pws.apply(
            registry, "slow_square", "id", result_type="square long, seen int", max_concurrency=4
        ).alias("r"),
        pws.apply(registry, "digits", "id").alias("d"),
    ).collect()
    assert len(rows) == 200
    seen = set()
    for row in rows:
        assert json.loads(row.d.result) == [int(c) for c in str(row.id)]
        if row.id == 13:
            assert (row.r.result, row.r.error) == (None, "KeyError: 13")
            continue
        assert row.r.error is None
        assert row.r.result.square == row.id**2
        seen.add(row.r.result.seen)
    assert max(seen) == 4  # concurrent, and never more than max_concurrency


MODULE = """
import rpc

registry = rpc.Registry()


@registry.handle("triple")
def triple(n: int) -> int:
    return n * 3
"""


def test_handlers_by_path_and_by_value(spark: SparkSession, tmp_path: Path) -> None:
    # by path: the module is imported on the executors (the repository is on their path)
    rows = (
        spark.range(0, 5)
        .select(
            pws.apply(
                "tests.spark_session:handlers",
                "double",
                F.col("id").cast("double"),
                result_type="double",
            ).alias("r")
        )
        .collect()
    )
    assert [r.r.result for r in rows] == [0.0, 2.0, 4.0, 6.0, 8.0]

    # by value: a module only this process can import reaches executors pickled
    (tmp_path / "pw_spark_by_value.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("pw_spark_by_value")
        pws.ship_by_value(module)
        rows = (
            spark.range(0, 5)
            .select(pws.apply(module.registry, "triple", "id", result_type="long").alias("r"))
            .collect()
        )
        assert [(r.r.result, r.r.error) for r in rows] == [(i * 3, None) for i in range(5)]
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pw_spark_by_value", None)


def test_options_object_and_keywords_are_the_same(spark: SparkSession) -> None:
    """``options=pws.ApplyOptions(...)``, its fields as keywords, or both (keywords win):
    the same column; ``apply_frame`` adds ``rpc`` by default, as ``call_frame`` does."""
    registry = shop()
    df = spark.createDataFrame([("a", 1), ("b", -1)], "name string, qty int")
    typed = pws.ApplyOptions(result_type="total double, label string", max_concurrency=2)
    rows = df.select(
        "name",
        pws.apply(registry, "price", "name", "qty", options=typed).alias("o"),
        pws.apply(registry, "price", "name", "qty", result_type="total double, label string").alias(
            "k"
        ),
        pws.apply(registry, "price", "name", "qty", options=typed, result_type=None).alias("j"),
    ).collect()
    for row in rows:
        assert row.o == row.k
    assert json.loads(rows[0].j.result) == {"total": 1.5, "label": "A"}
    assert rows[0].o.result.asDict() == {"total": 1.5, "label": "A"}

    out = pws.apply_frame(df, registry, "price", "name", "qty", options=typed)
    assert out.columns == ["name", "qty", "rpc"]
    assert [r.rpc for r in out.collect()] == [r.o for r in rows]

    with pytest.raises(TypeError, match="timeout"):
        pws.apply(registry, "price", "name", timeout=1.0)  # a call option, not an apply one
    with pytest.raises(TypeError, match="into= is for apply_frame"):
        pws.apply(registry, "price", "name", into="x")
    with pytest.raises(TypeError, match="must be a ApplyOptions"):
        pws.apply(registry, "price", "name", options=pws.CallOptions())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrency"):
        pws.ApplyOptions(max_concurrency=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.into = "x"  # type: ignore[misc]

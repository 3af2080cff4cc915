"""Spark Connect sessions (``SparkSession.builder.remote("local[2]")``) running both sides of
rpc.spark: remote calls (call / call_frame) and handlers on the executors (apply /
apply_frame). Each session runs in a process of its own (a process holds either a classic
session or a local Connect server, not both) against peerwire servers of this process:
examples/spark_enrich.py, and tests/peers/spark_connect_job.py, which checks every row
itself and reports in JSON.

The last test runs on the classic session of the other Spark tests: handler parameter types
that travel by value (dataclasses, TypedDicts, NamedTuples carry msgspec's unpicklable type
cache once a registry has seen them) on that kind of session too.

``SPARK_TESTING=1`` makes the local Connect server take a free port (PySpark's own switch
for parallel test runs, SPARK-42272) instead of 15002, which another run may hold.
"""

# no "from __future__ import annotations": the last test's handlers take types defined in
# the test function, which string annotations could not be resolved to
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import rpc
from rpc import spark as pws
from tests.spark_session import (  # noqa: F401
    ONE_SPARK_AT_A_TIME,
    ROOT,
    loop_thread_fixture,
    require_spark,
    serve_peer_fixture,
    spark_env,
    spark_fixture,
)

pytestmark = ONE_SPARK_AT_A_TIME


def run_connect(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` with ``--remote local[2]`` in a process of its own."""
    return subprocess.run(
        [sys.executable, script, "--remote", "local[2]", *args],
        cwd=ROOT,
        env={**os.environ, **spark_env(), "SPARK_TESTING": "1"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def greet_registry(calls: Counter[str]) -> rpc.Registry:
    """examples/greet.py's ``greet``, counting the names it is called with."""
    registry = rpc.Registry()

    @registry.handle("greet")
    def greet(params: dict[str, Any]) -> dict[str, str]:
        calls[params["name"]] += 1
        return {"greeting": f"Hello {params['name']}"}

    return registry


def test_spark_connect_session_runs_the_udf(serve_peer) -> None:
    require_spark()
    calls: Counter[str] = Counter()
    url = serve_peer("chatter", greet_registry(calls)).url
    n = 500
    proc = run_connect("examples/spark_enrich.py", "--url", url, "--rows", str(n))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "session: Spark Connect (pyspark.sql.connect.session)" in proc.stdout
    # static settings applied where they apply (the server's JVM), none refused
    assert "settings: spark.ui.enabled=false, spark.ui.showConsoleProgress=false, " in proc.stdout
    assert "spark.driver.memory=768m" in proc.stdout
    assert "CANNOT_MODIFY_CONFIG" not in proc.stderr
    assert f"enriched {n} rows" in proc.stdout
    assert ": 0 errors, 0 wrong" in proc.stdout
    assert calls == Counter({f"name-{i}": 1 for i in range(n)})


def test_the_example_runs_on_a_classic_session_too(serve_peer) -> None:
    """docs/spark.md's second line: the example without ``--remote`` makes a classic
    session, in a process of its own."""
    require_spark()
    calls: Counter[str] = Counter()
    url = serve_peer("gotalk", greet_registry(calls)).url
    proc = subprocess.run(
        [sys.executable, "examples/spark_enrich.py", "--url", url, "--rows", "300"],
        cwd=ROOT,
        env={**os.environ, **spark_env()},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "session: classic (pyspark.sql.session)" in proc.stdout
    assert "enriched 300 rows" in proc.stdout and ": 0 errors, 0 wrong" in proc.stdout
    assert calls == Counter({f"name-{i}": 1 for i in range(300)})


@dataclass
class Item:
    name: str
    qty: int


# checks the job makes on every row, and how many of those rows are errors by design: a
# negative quantity every tenth row (20 of 200), id 13 for the coroutine handlers
ROWS = 200
ROW_CHECKS = {
    "apply_frame.main.sync": 20,
    "apply_frame.value.sync": 20,
    "apply_frame.path.sync": 20,
    "apply_frame.main.async": 1,
    "apply_frame.value.async": 1,
    "apply_frame.path.async": 1,
    "apply_frame.main.json": 20,
    "apply_frame.async_generator": 0,
    "apply.path.sync": 20,
    "apply.value.async": 1,
    "call_frame.remote": 20,
}
OTHER_ROW_CHECKS = ("apply_frame.invalid_params", "apply_frame.result_does_not_fit")


def test_spark_connect_session_applies_handlers_and_calls_frames(serve_peer) -> None:
    require_spark()
    calls: Counter[tuple[str, Any]] = Counter()
    registry = rpc.Registry()

    @registry.handle("price")
    def price(item: Item) -> dict[str, object]:
        calls["price", item.name] += 1
        if item.qty < 0:
            raise ValueError("negative quantity")
        return {"total": item.qty * 1.5, "label": f"remote:{item.name.upper()}"}

    @registry.handle("check")
    def check(n: int) -> int:
        calls["check", n] += 1
        if n % 7 == 0:
            raise ValueError(f"{n} is unlucky")
        return n * 2

    url = serve_peer("gotalk", registry).url
    proc = run_connect("tests/peers/spark_connect_job.py", "--url", url, "--rows", str(ROWS))
    output = proc.stdout.strip().splitlines()
    assert output, proc.stderr[-4000:]
    report = json.loads(output[-1])
    assert (proc.returncode, report["mismatches"]) == (0, []), proc.stderr[-4000:]
    assert report["session"] == "pyspark.sql.connect.session"
    assert "CANNOT_MODIFY_CONFIG" not in proc.stderr
    for name in [*ROW_CHECKS, *OTHER_ROW_CHECKS]:
        assert report["rows"].get(name) == ROWS, name
    assert report["errors"] == {name: e for name, e in ROW_CHECKS.items() if e}
    # on the peer: exactly one call per row, also where a filter and two projections read
    # the result of call()
    expected = Counter({("price", f"item-{i}"): 1 for i in range(ROWS)})
    expected.update({("check", i): 1 for i in range(ROWS)})
    assert calls == expected
    # the other checks the job made
    for name in (
        "session.connect",
        "apply_frame.max_concurrency",
        "apply_frame.on_error_raise",
        "call.filtered",
        "call_frame.peer_down.rows",
        "call_frame.peer_down.fast",
    ):
        assert report["rows"].get(name) == 1, name
    assert report["rows"]["call.projections"] == len([i for i in range(ROWS) if i % 7])
    assert report["rows"]["call_frame.peer_down"] == 20


def test_classic_session_ships_msgspec_typed_handlers_by_value(spark: SparkSession) -> None:
    @dataclass
    class Order:
        item: str
        qty: int

    class Line(TypedDict):
        item: str
        qty: int

    class Pair(NamedTuple):
        a: int
        b: int

    registry = rpc.Registry()

    @registry.handle("order")
    def order(o: Order) -> str:
        return o.item * o.qty

    @registry.handle("line")
    def line(x: Line) -> int:
        return x["qty"] + 1

    @registry.handle("pair")
    async def pair(p: Pair) -> int:
        return p.a * p.b

    for cls in (Order, Line, Pair):  # what made pickling them fail
        assert "__msgspec_cache__" in vars(cls)
    df = spark.createDataFrame([("a", 2), ("b", 3)], "item string, qty int")
    rows = df.select(
        pws.apply(registry, "order", "item", "qty", result_type="string").alias("o"),
        pws.apply(registry, "line", "item", "qty", result_type="int").alias("l"),
        pws.apply(registry, "pair", F.array("qty", "qty"), result_type="int").alias("p"),
    ).collect()
    assert [(r.o.result, r.l.result, r.p.result) for r in rows] == [("aa", 3, 4), ("bbb", 4, 9)]
    assert all(r.o.error is None and r.l.error is None and r.p.error is None for r in rows)
    out = pws.apply_frame(df, registry, "order", "item", "qty", into="o", result_type="string")
    assert [(r.item, r.o.result) for r in out.collect()] == [("a", "aa"), ("b", "bbb")]

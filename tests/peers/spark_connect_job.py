"""rpc.spark's apply / apply_frame and call / call_frame on a Spark Connect session.

Run in a process of its own (a process holds either a classic session or a local Connect
server, not both) by tests/test_spark_connect.py:

    python tests/peers/spark_connect_job.py --remote 'local[2]' --url tcp+gotalk://127.0.0.1:4000

The peer at ``--url`` must serve ``price`` (an ``Item`` -> ``{"total": qty * 1.5, "label":
"remote:" + NAME}``, ValueError for a negative quantity) and ``check`` (an id -> twice the
id, ValueError for multiples of 7). The job runs:

- apply_frame / apply with a synchronous and a coroutine handler from three registries: one
  defined here (in ``__main__``: pickled by value), a module shipped with
  :func:`rpc.spark.ship_by_value`, and a module passed as a ``"module:registry"`` path and
  shipped with ``spark.addArtifacts(..., pyfile=True)`` (neither module is on the executors'
  path otherwise); results carry the registry's tag, so each row says whose code ran;
- per-row errors in the error column (handler errors, invalid parameters, a result that does
  not fit ``result_type``) and ``on_error="raise"`` failing the job;
- call_frame against ``--url`` (typed results, remote errors), call in a filter and two
  projections, and call_frame against a port nobody listens on.

It prints one JSON object (the last line of stdout: rows checked and error rows per check,
mismatches, seconds per step) and exits 1 on any mismatch. The local Connect server listens
on 127.0.0.1 only; with ``SPARK_TESTING=1`` in the environment (as the test sets it) on a
free port instead of 15002.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402

MODULE = '''
"""Handlers of the {tag!r} registry (written by spark_connect_job.py)."""

import asyncio
from dataclasses import dataclass

import rpc

TAG = {tag!r}
registry = rpc.Registry()


@dataclass
class Item:
    name: str
    qty: int


@registry.handle("price")
def price(item: Item) -> dict[str, object]:
    if item.qty < 0:
        raise ValueError("negative quantity")
    return {{"total": item.qty * 1.5, "label": f"{{TAG}}:{{item.name.upper()}}"}}


@registry.handle("square")
async def square(n: int) -> dict[str, object]:
    await asyncio.sleep(0)
    if n == 13:
        raise KeyError(n)
    return {{"square": n * n, "tag": TAG}}
'''


# --- the registry defined here: travels by value, pickled with the UDF ---------------------


@dataclass
class Item:
    name: str
    qty: int


registry = rpc.Registry()
active = {"now": 0}


@registry.handle("price")
def price(item: Item) -> dict[str, object]:
    if item.qty < 0:
        raise ValueError("negative quantity")
    return {"total": item.qty * 1.5, "label": f"main:{item.name.upper()}"}


@registry.handle("square")
async def square(n: int) -> dict[str, object]:
    active["now"] += 1
    seen = active["now"]
    await asyncio.sleep(0.005)  # the handler's work: calls overlap meanwhile (not a wait)
    active["now"] -= 1
    if n == 13:
        raise KeyError(n)
    return {"square": n * n, "tag": "main", "seen": seen}


@registry.handle("digits")
async def digits(n: int) -> AsyncIterator[int]:
    for c in str(n):
        yield int(c)


# --- expectations ------------------------------------------------------------------------


def qty_of(i: int) -> int:
    return i % 10 - 1  # -1 (a handler error) for every tenth row


def expect_price(tag: str, i: int, error_prefix: str = "ValueError") -> tuple[Any, Any]:
    if qty_of(i) < 0:
        return None, f"{error_prefix}: negative quantity"
    return {"total": qty_of(i) * 1.5, "label": f"{tag}:ITEM-{i}"}, None


def expect_square(tag: str, i: int) -> tuple[Any, Any]:
    if i == 13:
        return None, "KeyError: 13"
    return {"square": i * i, "tag": tag}, None


class Checks:
    """Compares rows with expectations; remembers the first few mismatches per check."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.mismatches: list[str] = []
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[step] = round(time.perf_counter() - started, 2)

    def row(self, check: str, i: int, got: tuple[Any, Any], want: tuple[Any, Any]) -> None:
        self.rows[check] = self.rows.get(check, 0) + 1
        if got[1] is not None:
            self.errors[check] = self.errors.get(check, 0) + 1
        if got != want and sum(m.startswith(check) for m in self.mismatches) < 5:
            self.mismatches.append(f"{check} row {i}: got {got!r}, want {want!r}")

    def true(self, check: str, ok: bool, detail: str) -> None:
        self.rows[check] = self.rows.get(check, 0) + 1
        if not ok:
            self.mismatches.append(f"{check}: {detail}")


def pair(cell: Any, fields: tuple[str, ...] | None = None) -> tuple[Any, Any]:
    """A ``struct<result, error>`` cell as ``(result, error)``; a typed struct result as a
    dict of ``fields`` (all of them when None)."""
    result = cell.result
    if result is not None and hasattr(result, "asDict"):
        result = result.asDict()
        if fields is not None:
            result = {k: result[k] for k in fields}
    return result, cell.error


# --- the job -----------------------------------------------------------------------------


def session(remote: str) -> Any:
    """A local Spark Connect session with the test suite's small-JVM settings."""
    from tests.spark_session import SPARK_CONF, connect_builder

    conf = {**SPARK_CONF, "spark.connect.grpc.binding.address": "127.0.0.1"}
    return connect_builder(remote, conf).appName("peerwire-spark-connect-job").getOrCreate()


def modules(spark: Any, workdir: Path) -> tuple[Any, str]:
    """The module shipped by value (returned as a module) and the module shipped as an
    artifact (returned as its registry path); both importable here only."""
    from rpc import spark as pws

    for name, tag in (("pw_connect_by_value", "value"), ("pw_connect_artifact", "artifact")):
        (workdir / f"{name}.py").write_text(MODULE.format(tag=tag))
    sys.path.insert(0, str(workdir))  # the driver imports both (resolve() checks the op)
    by_value = importlib.import_module("pw_connect_by_value")
    pws.ship_by_value(by_value)
    spark.addArtifacts(str(workdir / "pw_connect_artifact.py"), pyfile=True)
    return by_value, "pw_connect_artifact:registry"


def items(spark: Any, n: int) -> Any:
    """``id``, ``name`` "item-<id>" and ``qty`` (-1 for every tenth row), two partitions."""
    from pyspark.sql import functions as F

    return spark.range(0, n, numPartitions=2).select(
        "id",
        F.concat(F.lit("item-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") % 10 - 1).cast("int").alias("qty"),
    )


def check_apply(spark: Any, checks: Checks, n: int, by_value: Any, by_path: str) -> None:
    from rpc import spark as pws

    df = items(spark, n)
    typed = "total double, label string"
    sq_typed = "square long, tag string"

    def frame(check: str, handlers: Any, op: str, *cols: str, **kw: Any) -> list[Any]:
        """One apply_frame job (one level of mapInArrow: chained ones would each want
        Python workers of their own); every input column kept, the result in ``out``."""
        out = pws.apply_frame(df, handlers, op, *cols, into="out", **kw)
        checks.true(f"{check}.columns", out.columns == [*df.columns, "out"], str(out.columns))
        with checks.timed(check):
            rows = out.collect()
        checks.true(f"{check}.rows", len(rows) == n, f"{len(rows)} rows, not {n}")
        for r in rows:
            kept = (r.qty, r.name) == (qty_of(r.id), f"item-{r.id}")
            checks.true(f"{check}.kept", kept, f"row {r.id}: {r!r}")
        return rows

    # synchronous and coroutine handlers of the three registries, typed results
    for where, handlers, tag in (
        ("main", registry, "main"),
        ("value", by_value.registry, "value"),
        ("path", by_path, "artifact"),
    ):
        check = f"apply_frame.{where}.sync"
        for r in frame(check, handlers, "price", "name", "qty", result_type=typed):
            checks.row(check, r.id, pair(r.out), expect_price(tag, r.id))
        if where == "main":  # a bound on concurrency: what the handler saw is in "seen"
            continue
        check = f"apply_frame.{where}.async"
        for r in frame(check, handlers, "square", "id", result_type=sq_typed):
            checks.row(check, r.id, pair(r.out), expect_square(tag, r.id))

    # coroutines run concurrently on the worker loop, never more than max_concurrency
    check, seen = "apply_frame.main.async", set()
    bounded = "square long, tag string, seen int"
    for r in frame(check, registry, "square", "id", result_type=bounded, max_concurrency=4):
        got = pair(r.out)
        if got[0] is not None:
            seen.add(got[0].pop("seen"))
        checks.row(check, r.id, got, expect_square("main", r.id))
    checks.true("apply_frame.max_concurrency", max(seen, default=0) == 4, f"seen {sorted(seen)}")

    # JSON results; an async generator's parts as a list
    check = "apply_frame.main.json"
    for r in frame(check, registry, "price", "name", "qty"):
        got = (json.loads(r.out.result) if r.out.result is not None else None, r.out.error)
        checks.row(check, r.id, got, expect_price("main", r.id))
    check = "apply_frame.async_generator"
    for r in frame(check, registry, "digits", "id"):
        got = (json.loads(r.out.result), r.out.error)
        checks.row(check, r.id, got, ([int(c) for c in str(r.id)], None))

    # per-row errors: parameters that do not validate, a result that does not fit the type
    check = "apply_frame.invalid_params"
    for r in frame(check, registry, "price", "name"):  # qty missing
        error = r.out.error or ""
        ok = r.out.result is None and error.startswith("PayloadError: invalid parameters")
        checks.true(check, ok, f"row {r.id}: {r.out!r}")
    check = "apply_frame.result_does_not_fit"
    for r in frame(check, registry, "price", "name", "qty", result_type="int"):
        error = r.out.error or ""
        want = "ValueError: negative quantity" if qty_of(r.id) < 0 else "TypeError: result {"
        checks.true(check, r.out.result is None and error.startswith(want), f"{r.out!r}")

    # the column form: sync by path and async by value, in one select
    with checks.timed("apply.columns"):
        cols = df.select(
            "id",
            pws.apply(by_path, "price", "name", "qty", result_type=typed).alias("p"),
            pws.apply(by_value.registry, "square", "id", result_type=sq_typed).alias("s"),
        ).collect()
    checks.true("apply.rows", len(cols) == n, f"{len(cols)} rows, not {n}")
    for r in cols:
        checks.row("apply.path.sync", r.id, pair(r.p), expect_price("artifact", r.id))
        checks.row("apply.value.async", r.id, pair(r.s), expect_square("value", r.id))

    # on_error="raise": the first error fails the job, saying why
    try:
        with checks.timed("apply_frame.on_error_raise"):
            pws.apply_frame(df, registry, "price", "name", "qty", on_error="raise").collect()
        checks.true("apply_frame.on_error_raise", False, "the job did not fail")
    except Exception as exc:
        text = str(exc)
        ok = "SparkCallError" in text and "negative quantity" in text
        checks.true("apply_frame.on_error_raise", ok, f"{type(exc).__name__}: {text[:500]}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check_call(spark: Any, checks: Checks, n: int, url: str) -> None:
    from pyspark.sql import functions as F

    from rpc import spark as pws

    df = items(spark, n)
    out = pws.call_frame(
        df,
        url,
        "price",
        "name",
        "qty",
        into="rpc",
        result_type="total double, label string",
        max_in_flight=16,
    )
    checks.true("call_frame.columns", out.columns == ["id", "name", "qty", "rpc"], out.columns)
    with checks.timed("call_frame"):
        rows = out.collect()
    checks.true("call_frame.rows", len(rows) == n, f"{len(rows)} rows, not {n}")
    for r in rows:
        want = expect_price("remote", r.id, error_prefix="RemoteError")
        checks.row("call_frame.remote", r.id, pair(r.rpc), want)
        kept = (r.qty, r.name) == (qty_of(r.id), f"item-{r.id}")
        checks.true("call_frame.kept", kept, f"row {r.id}: {r!r}")

    # a filter on the result and two projections of it: still one call per row
    kept = (
        df.withColumn("c", pws.call(url, "check", "id", result_type="long"))
        .where(F.col("c.error").isNull())
        .select("id", F.col("c.result").alias("twice"), (F.col("c.result") + 1).alias("plus"))
        .collect()
    )
    ids = sorted(r.id for r in kept)
    checks.true("call.filtered", ids == [i for i in range(n) if i % 7], f"kept {ids[:20]}...")
    for r in kept:
        ok = (r.twice, r.plus) == (2 * r.id, 2 * r.id + 1)
        checks.true("call.projections", ok, f"row {r.id}: {r!r}")

    # nobody listens: every row fails fast with ConnectionClosed, the job does not
    down = f"tcp+gotalk://127.0.0.1:{free_port()}"
    started = time.perf_counter()
    dead = pws.call_frame(
        df.limit(20), down, "price", "name", "qty", connect_timeout=2.0, retry_for=1.0
    )
    dead_rows = dead.collect()
    checks.true("call_frame.peer_down.rows", len(dead_rows) == 20, f"{len(dead_rows)} rows")
    for r in dead_rows:
        error = r.rpc.error or ""
        checks.true(
            "call_frame.peer_down",
            r.rpc.result is None and error.startswith("ConnectionClosed: cannot connect"),
            f"row {r.id}: {r.rpc!r}",
        )
    checks.true("call_frame.peer_down.fast", time.perf_counter() - started < 30, "too slow")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", default="local[2]", help="Spark Connect: local[2], sc://..")
    parser.add_argument("--url", required=True, help="the peerwire server to call")
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    checks = Checks()
    with checks.timed("session"):
        spark = session(args.remote)
    kind = type(spark).__module__
    checks.true("session.connect", kind == "pyspark.sql.connect.session", kind)
    with tempfile.TemporaryDirectory(prefix="pw-connect-") as tmp:
        by_value, by_path = modules(spark, Path(tmp))
        steps: dict[str, Callable[[], None]] = {
            "apply": lambda: check_apply(spark, checks, args.rows, by_value, by_path),
            "call": lambda: check_call(spark, checks, args.rows, args.url),
        }
        for name, step in steps.items():
            try:
                with checks.timed(name):
                    step()
            except Exception as exc:  # a failed step is a mismatch; the others still run
                checks.true(f"{name}.step", False, f"{type(exc).__name__}: {str(exc)[:1000]}")
        spark.stop()
    report = {
        "session": kind,
        "rows": checks.rows,
        "errors": checks.errors,
        "mismatches": checks.mismatches,
        "seconds": checks.seconds,
    }
    print(json.dumps(report, sort_keys=True))
    return 1 if checks.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

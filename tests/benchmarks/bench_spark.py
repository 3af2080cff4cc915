"""Spark remote-call benchmark: ``python tests/benchmarks/bench_spark.py [--rows N]``.

Not collected by pytest. A peerwire server runs as a subprocess of this script (``--serve``;
it prints ``PORT <n>`` and serves until its stdin closes) with two ops: ``echo`` (answers
at once) and ``echo_1ms`` (a coroutine handler that answers after ``asyncio.sleep(0.001)``).
This process is the Spark driver (local[2]: two Python workers) and the plain client. For
each op, rows per second over ``--rows`` rows (default 200,000) of:

- ``ceiling``: a plain pipelined Python client without Spark, one connection,
  ``--window`` requests in flight (``rpc.connect`` + ``peer.request``), in this process;
- ``pipelined UDF``: ``rpc.spark.call`` over ``spark.range(rows, numPartitions=2)`` (one
  connection per Python worker, ``--window`` in flight each);
- ``per-row UDF``: a plain ``@udf`` making one blocking request per row over a connection
  it keeps (``rpc.blocking``), the naive way.

Every row's result is checked (a Spark job counts the rows without an error). Workers are
warmed up first; the ceiling and the pipelined UDF are measured ``--repeat`` times,
interleaved, and the best of each is shown (the per-row UDF, being latency-bound and slow,
once). The first line gives Spark's own rate for the same job with an identity Arrow UDF.
Absolute figures drift with the machine; the ratios are the point. ``--smoke`` (CI): 2,000
rows (200 for the per-row UDF), once, without the warm-up jobs: every row runs and the
ratios are printed, but the figures are rough (Spark's start-up dominates such a run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402
from rpc import loops  # noqa: E402

OPS = (("echo", "no delay"), ("echo_1ms", "1 ms delay"))


# --- the server ----------------------------------------------------------------------------


def serve(scheme: str, loop: str) -> None:
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @registry.handle("echo_1ms")
    async def echo_1ms(value: Any) -> Any:
        await asyncio.sleep(0.001)
        return value

    async def main() -> None:
        options = rpc.Options(max_concurrent=4096)
        async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry, options=options) as s:
            print(f"PORT {s.url.port}", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    loops.run(main(), loop)


def start_server(scheme: str, loop: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--scheme", scheme, "--server-loop", loop],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        raise RuntimeError(f"server did not start: {line!r}")
    query = "?dialect=HatChatter" if scheme == "tcp+sbs" else ""
    return proc, f"{scheme}://127.0.0.1:{int(line.split()[1])}{query}"


# --- the measurements ----------------------------------------------------------------------


def ceiling(url: str, op: str, rows: int, window: int) -> float:
    """A plain pipelined client: ``window`` workers, each awaiting one request at a time."""

    async def main() -> float:
        async with rpc.connect(url, registry=rpc.Registry()) as peer:
            for i in range(1000):  # warm-up
                await peer.request(op, i)
            counter = iter(range(rows))

            async def worker() -> None:
                for i in counter:
                    if await peer.request(op, i, timeout=60) != i:
                        raise AssertionError(f"bad result for {i}")

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(window)))
            return rows / (time.perf_counter() - started)

    return asyncio.run(main())


def pipelined_udf(spark: Any, url: str, op: str, rows: int, window: int) -> float:
    from pyspark.sql import functions as F

    from rpc import spark as pws

    df = spark.range(0, rows, numPartitions=2)
    result = pws.call(url, op, "id", result_type="long", max_in_flight=window, timeout=60)
    job = df.select(F.col("id"), result.alias("r")).agg(
        F.count(F.when(F.col("r.error").isNull() & (F.col("r.result") == F.col("id")), 1))
    )
    started = time.perf_counter()
    ok = job.collect()[0][0]
    elapsed = time.perf_counter() - started
    if ok != rows:
        raise AssertionError(f"pipelined UDF: {rows - ok} rows failed")
    return rows / elapsed


def per_row_udf(spark: Any, url: str, op: str, rows: int) -> float:
    from pyspark.sql import functions as F

    cache: dict[str, Any] = {}  # pickled with the UDF: one connection per task

    def call_one(value):  # type: ignore[no-untyped-def]  # no hints: a plain row-at-a-time UDF
        peer = cache.get("peer")
        if peer is None:
            peer = cache["peer"] = rpc.blocking.connect(url, registry=rpc.Registry())
        return peer.request(op, value, timeout=60)

    udf = F.udf(call_one, "long", useArrow=False).asNondeterministic()
    df = spark.range(0, rows, numPartitions=2)
    job = df.select("id", udf("id").alias("r")).agg(F.count(F.when(F.col("r") == F.col("id"), 1)))
    started = time.perf_counter()
    ok = job.collect()[0][0]
    elapsed = time.perf_counter() - started
    if ok != rows:
        raise AssertionError(f"per-row UDF: {rows - ok} rows failed")
    return rows / elapsed


def session(smoke: bool = False) -> Any:
    """A local[2] session; for smoke runs the JVM compiles with C1 only (starts sooner,
    runs slower: no figure of such a run is worth keeping)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("peerwire-bench")
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC"
        + (" -XX:TieredStopAtLevel=1" if smoke else ""),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.log.level": "ERROR",
    }
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def identity_udf(spark: Any, rows: int) -> float:
    """Spark's own cost: the same job with an Arrow UDF that returns its input."""
    from pyspark.sql import functions as F

    def identity(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
        yield from arrays

    udf = F.arrow_udf(identity, "long").asNondeterministic()
    df = spark.range(0, rows, numPartitions=2)
    job = df.select("id", udf("id").alias("r")).agg(F.count(F.when(F.col("r") == F.col("id"), 1)))
    started = time.perf_counter()
    job.collect()
    return rows / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument(
        "--per-row-rows", type=int, help="rows for the per-row UDF (default: --rows)"
    )
    parser.add_argument("--window", type=int, default=128, help="requests in flight")
    parser.add_argument("--repeat", type=int, default=3, help="best of N (not the per-row UDF)")
    parser.add_argument("--scheme", default="tcp+gotalk", choices=["tcp+gotalk", "tcp+sbs"])
    parser.add_argument("--only", choices=[op for op, _ in OPS], help="one op only")
    parser.add_argument("--smoke", action="store_true", help="2,000 rows, once (CI)")
    parser.add_argument(
        "--server-loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="the server's event loop, as `peerwire serve --loop` (auto: uvloop if installed)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.scheme, args.server_loop)
        return
    if args.smoke:
        args.rows, args.per_row_rows, args.repeat = 2_000, 200, 1

    per_row_rows = args.per_row_rows or args.rows
    proc, url = start_server(args.scheme, args.server_loop)
    spark = session(args.smoke)
    try:
        if not args.smoke:  # warm-up: start the Python workers, open their connections
            identity_udf(spark, 20_000)
            for op, _ in OPS:
                pipelined_udf(spark, url, op, 20_000, args.window)
                per_row_udf(spark, url, op, 2_000)
        floor = max(identity_udf(spark, args.rows) for _ in range(args.repeat))
        print(
            f"{args.rows:,} rows ({per_row_rows:,} for the per-row UDF), {url.split(':')[0]}, "
            f"server loop {loops.resolve(args.server_loop)}, "
            f"window {args.window}, local[2], best of {args.repeat}; "
            f"Spark alone (identity Arrow UDF): {floor:,.0f} rows/s"
        )
        print(
            f"{'server delay':<14}{'ceiling':>12}{'pipelined UDF':>16}{'per-row UDF':>14}"
            f"{'UDF/ceiling':>13}{'UDF/per-row':>13}"
        )
        for op, label in OPS:
            if args.only and op != args.only:
                continue
            tops, fasts = [], []
            for _ in range(args.repeat):  # interleaved: both see the same machine load
                tops.append(ceiling(url, op, args.rows, args.window))
                fasts.append(pipelined_udf(spark, url, op, args.rows, args.window))
            top, fast = max(tops), max(fasts)
            slow = per_row_udf(spark, url, op, per_row_rows)
            print(
                f"{label:<14}{top:>10,.0f}/s{fast:>14,.0f}/s{slow:>12,.0f}/s"
                f"{fast / top:>12.0%}{fast / slow:>12.1f}x",
                flush=True,
            )
    finally:
        spark.stop()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


if __name__ == "__main__":
    main()

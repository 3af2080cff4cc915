"""Enrich a DataFrame by calling a peer from the Spark executors.

Needs the spark extra (``pip install -e '.[spark]'``) and Java 17+. Start a peer, then run
the job on a local classic session or on a local Spark Connect session:

    peerwire serve examples/greet.py --listen tcp+gotalk://127.0.0.1:4000
    python examples/spark_enrich.py --url tcp+gotalk://127.0.0.1:4000
    python examples/spark_enrich.py --url tcp+gotalk://127.0.0.1:4000 --remote 'local[2]'

Without ``--url`` it serves examples/greet.py's handlers itself, on a free port. Every row's
name goes to the peer's ``greet`` op; the greeting comes back as a typed column. The job
checks every row and exits 1 if any call failed or any greeting is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402


def serve_greet() -> str:
    """examples/greet.py's registry on a free port, in a background thread."""
    from examples.greet import registry

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    start = rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry).start()
    server = asyncio.run_coroutine_threadsafe(start, loop).result(10)
    return str(server.url)


# Settings fixed when the driver JVM starts, and SQL settings any session may change.
STATIC_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "768m",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC",
}
SQL_CONF = {"spark.sql.shuffle.partitions": "2"}


def session(master: str, remote: str | None):  # -> SparkSession
    """A small session: this interpreter on the executors, loopback, no UI.

    Static settings go where they apply: to the builder of a classic session; for a local
    Spark Connect server (``--remote local[2]``) to the spark-submit that starts its JVM
    (``PYSPARK_SUBMIT_ARGS``); a remote server (``sc://...``) keeps its own. Only SQL
    settings are set on a Connect session (it refuses static ones)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("peerwire-spark-enrich")
    if remote is None:
        builder = builder.master(master)
        conf = {**STATIC_CONF, **SQL_CONF}
    else:
        if remote.startswith("local"):
            flags = [f"--conf {shlex.quote(f'{k}={v}')}" for k, v in STATIC_CONF.items()]
            os.environ.setdefault("PYSPARK_SUBMIT_ARGS", " ".join([*flags, "pyspark-shell"]))
        builder = builder.remote(remote)
        conf = SQL_CONF
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="the peer to call (default: serve examples/greet.py)")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--master", default="local[2]", help="classic session master")
    parser.add_argument("--remote", help="Spark Connect instead, e.g. 'local[2]' or sc://host")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from rpc import spark as pws

    url = args.url or serve_greet()
    spark = session(args.master, args.remote)
    kind = "Spark Connect" if "connect" in type(spark).__module__ else "classic"
    print(f"session: {kind} ({type(spark).__module__}), peer: {url}")
    if args.remote is None or args.remote.startswith("local"):
        settings = ", ".join(f"{k}={spark.conf.get(k, None)}" for k in STATIC_CONF)
        print(f"settings: {settings}")

    people = spark.range(0, args.rows, numPartitions=2).withColumn(
        "name", F.concat(F.lit("name-"), F.col("id").cast("string"))
    )
    enriched = people.withColumn(
        "greeting",
        # one struct column -> the request {"name": ...}; greet answers {"greeting": ...}
        pws.call(url, "greet", F.struct("name"), result_type="greeting string", idempotent=True),
    ).select(
        "id",
        "name",
        F.col("greeting.result.greeting").alias("text"),
        F.col("greeting.error").alias("error"),
    )

    started = time.perf_counter()
    rows = enriched.collect()
    elapsed = time.perf_counter() - started
    for row in rows[:5]:
        print(f"  {row.id:>6}  {row.name:<12} {row.text or row.error}")
    errors = sum(1 for r in rows if r.error is not None)
    wrong = sum(1 for r in rows if r.error is None and r.text != f"Hello {r.name}")
    print(
        f"enriched {len(rows)} rows in {elapsed:.2f} s ({len(rows) / elapsed:,.0f} rows/s): "
        f"{errors} errors, {wrong} wrong"
    )
    spark.stop()
    return 0 if len(rows) == args.rows and not errors and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())

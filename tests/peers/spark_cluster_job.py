"""rpc.spark on a standalone cluster whose executors run a packed environment.

Submitted by tests/test_spark_cluster.py with ``spark-submit --archives env.tar.gz#env``
and ``PYSPARK_PYTHON=./env/bin/python``; the peer at ``--url`` serves ``greet`` (a name ->
"Hello <name>") and ``check`` (an id -> twice the id, an error for id 7). It prints one JSON
object (the last line of stdout):

- ``executors``: where the executors' Python and peerwire came from;
- ``rows`` / ``bad``: rows of a ``pws.call`` job, and rows whose result was not right;
- ``raise_error``: the job error of an ``on_error="raise"`` call that fails at id 7 (Spark
  re-runs the failed task up to ``spark.task.maxFailures`` times).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def where(_: Any) -> list[dict[str, str]]:
    """On an executor: its Python and the peerwire it imports."""
    import pyarrow

    import rpc

    return [{"python": sys.executable, "rpc": rpc.__file__, "pyarrow": pyarrow.__file__}]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from rpc import spark as pws

    spark = SparkSession.builder.appName("peerwire-cluster-test").getOrCreate()
    report: dict[str, Any] = {}
    report["executors"] = spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()

    people = spark.range(0, args.rows, numPartitions=2).withColumn(
        "name", F.concat(F.lit("n"), F.col("id").cast("string"))
    )
    rows = people.select(
        "id", "name", pws.call(args.url, "greet", "name", result_type="string").alias("g")
    ).collect()
    report["rows"] = len(rows)
    report["bad"] = [r.id for r in rows if r.g.error is not None or r.g.result != f"Hello {r.name}"]

    try:
        people.select(pws.call(args.url, "check", "id", on_error="raise", key="name")).collect()
        report["raise_error"] = None
    except Exception as exc:
        report["raise_error"] = str(exc)
    print(json.dumps(report))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ship peerwire to Spark Connect executors as a zip artifact; report where it loaded from.

    python tests/peers/spark_zip_job.py --remote 'local[2]' --zip build/peerwire.zip

The zip (the installed ``rpc``, ``wire`` and ``transports`` packages) goes to the session
with ``spark.addArtifacts(zip, pyfile=True)``. A UDF on the executors imports ``wire``,
loads the SBS schemas and encodes a Hat Chatter message with them, and returns where
``wire`` and the schemas came from. Prints one JSON line per row.
"""

from __future__ import annotations

import argparse
import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType


def on_executor(n: int) -> str:
    import importlib.resources

    import wire
    from wire import schemas

    repo = schemas.repository()
    encoded = repo.encode(
        "HatChatter.Msg",
        {
            "id": n,
            "first": n,
            "owner": True,
            "token": True,
            "last": True,
            "data": {"type": "x", "data": b""},
        },
    )
    return json.dumps(
        {
            "wire": wire.__file__,
            "schemas": str(importlib.resources.files("wire.schemas_sbs")),
            "bytes": len(encoded),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--zip", required=True)
    args = parser.parse_args()
    spark = SparkSession.builder.remote(args.remote).appName("peerwire-zip-artifact").getOrCreate()
    try:
        spark.addArtifacts(args.zip, pyfile=True)
        report = F.udf(on_executor, StringType())
        for row in spark.range(2).select(report("id").alias("r")).collect():
            print(row.r, flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()

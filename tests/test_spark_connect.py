"""A Spark Connect session (``SparkSession.builder.remote("local[2]")``) running the same
remote-call UDF: examples/spark_enrich.py in its own process (a process holds either a
classic session or a local Connect server, not both) against a server of this process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from typing import Any

import rpc
from tests.spark_session import (  # noqa: F401
    ROOT,
    loop_thread_fixture,
    require_spark,
    serve_peer_fixture,
    spark_env,
)


def test_spark_connect_session_runs_the_udf(serve_peer) -> None:
    require_spark()
    calls: Counter[str] = Counter()
    registry = rpc.Registry()

    @registry.handle("greet")
    def greet(params: dict[str, Any]) -> dict[str, str]:
        calls[params["name"]] += 1
        return {"greeting": f"Hello {params['name']}"}

    url = serve_peer("chatter", registry).url
    n = 500
    proc = subprocess.run(
        [
            sys.executable,
            "examples/spark_enrich.py",
            "--remote",
            "local[2]",
            "--url",
            url,
            "--rows",
            str(n),
        ],
        cwd=ROOT,
        env={**os.environ, **spark_env()},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "session: Spark Connect (pyspark.sql.connect.session)" in proc.stdout
    assert f"enriched {n} rows" in proc.stdout
    assert ": 0 errors, 0 wrong" in proc.stdout
    assert calls == Counter({f"name-{i}": 1 for i in range(n)})

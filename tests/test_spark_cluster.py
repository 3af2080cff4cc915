"""The packed-environment deployment on a standalone cluster: a master and a worker started
from the pyspark package's ``spark-class`` (127.0.0.1, free ports, 2 cores), a virtual
environment with peerwire and pyarrow built here and packed with venv-pack, and
tests/peers/spark_cluster_job.py submitted with ``--archives env.tar.gz#env`` and
``PYSPARK_PYTHON=./env/bin/python``, so that the executors import peerwire from the archive
only (the repository is on no executor's path). Also checks that ``on_error="raise"`` calls
each row at most once although Spark runs a failed task up to four times.

Takes one to two minutes (building the environment is most of it); marked ``cluster``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rpc
import rpc.loops
from tests.rpc_helpers import free_ports
from tests.spark_session import (  # noqa: F401
    ONE_SPARK_AT_A_TIME,
    ROOT,
    loop_thread_fixture,
    require_spark,
    serve_peer_fixture,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600), ONE_SPARK_AT_A_TIME]
ROWS = 1000


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_env(work: Path) -> dict[str, str]:
    """The daemons' and spark-submit's environment: loopback, small JVMs, nothing of the
    repository on any Python path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_WORKER_DIR=str(work / "worker"),
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_CONF_DIR=str(work / "conf"),
    )
    (work / "conf").mkdir(exist_ok=True)
    return env


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    assert proc.returncode == 0, f"{cmd[:3]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(name="packed_env")
def packed_env_fixture(tmp_path: Path) -> Path:
    """env.tar.gz: a venv (of this interpreter) with peerwire from this tree and pyarrow;
    on a uvloop run (``$PEERWIRE_LOOP``, which the executors inherit) with its ``speed``
    extra, as a deployment that asks for uvloop must ship it."""
    env = tmp_path / "env"
    run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python")]
    speed = "[speed]" if os.environ.get(rpc.loops.ENV_VAR) == "uvloop" else ""
    run([*pip, "install", "-q", f"{ROOT}{speed}", "pyarrow"], timeout=400)
    archive = tmp_path / "env.tar.gz"
    venv_pack = Path(sys.executable).parent / "venv-pack"
    run([str(venv_pack), "-p", str(env), "-o", str(archive), "--compress-level", "1", "-q"])
    shutil.rmtree(env)  # the executors must get everything from the archive
    return archive


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as reply:
            state = json.load(reply)
    except (OSError, ValueError):  # not up yet, or not the master's JSON (yet)
        return 0
    return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")


@pytest.fixture(name="cluster")
def cluster_fixture(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A standalone master and one 2-core worker; yields the master URL and environment."""
    require_spark()
    env = cluster_env(tmp_path)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui, worker_ui = free_ports(3)
    master_url = f"spark://127.0.0.1:{port}"
    logs = contextlib.ExitStack()
    master_log = logs.enter_context(open(tmp_path / "master.log", "w"))  # noqa: SIM115
    worker_log = logs.enter_context(open(tmp_path / "worker.log", "w"))  # noqa: SIM115
    daemons = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=subprocess.DEVNULL, stderr=master_log,
        ),
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
             "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g", master_url],
            env=env, stdout=subprocess.DEVNULL, stderr=worker_log,
        ),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while alive_workers(ui) < 1:
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                logs = [(tmp_path / f).read_text()[-2000:] for f in ("master.log", "worker.log")]
                pytest.fail(f"the standalone cluster did not come up: {logs}")
            time.sleep(0.2)  # polling the master's state, with a deadline
        yield master_url, env
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(10)
        logs.close()


def test_packed_environment_on_a_standalone_cluster(
    cluster: tuple[str, dict[str, str]], packed_env: Path, serve_peer, tmp_path: Path
) -> None:
    master_url, env = cluster
    calls: Counter[tuple[str, Any]] = Counter()
    registry = rpc.Registry()

    @registry.handle("greet")
    def greet(name: str) -> str:
        calls["greet", name] += 1
        return f"Hello {name}"

    @registry.handle("check")
    def check(n: int) -> int:
        calls["check", n] += 1
        if n == 7:
            raise ValueError("7 is unlucky")
        return n * 2

    url = serve_peer("gotalk", registry).url
    submit = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", master_url,
        "--archives", f"{packed_env}#env",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.driver.memory=512m",
        "--conf", "spark.executor.memory=512m",
        "--conf", "spark.driver.host=127.0.0.1",
        str(ROOT / "tests" / "peers" / "spark_cluster_job.py"),
        "--url", url, "--rows", str(ROWS),
    ]  # fmt: skip
    job_env = {
        **env,
        "PYSPARK_PYTHON": "./env/bin/python",  # the executors' Python: from the archive
        "PYSPARK_DRIVER_PYTHON": sys.executable,  # the driver's: this one
        "PYTHONPATH": str(ROOT),  # the driver's only: spark-submit does not pass it on
    }
    proc = run(submit, env=job_env, cwd=tmp_path, timeout=300)
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    # the executors ran the archive's Python and imported peerwire from it
    assert len(report["executors"]) == 2
    for executor in report["executors"]:
        assert executor["python"].endswith("/env/bin/python"), executor
        assert "/env/lib/python" in executor["rpc"] and "site-packages" in executor["rpc"]
        assert not executor["rpc"].startswith(str(ROOT)), executor
    assert (report["rows"], report["bad"]) == (ROWS, [])
    assert Counter(k for k in calls if k[0] == "greet") == Counter(
        {("greet", f"n{i}"): 1 for i in range(ROWS)}
    )

    # on_error="raise": the row is named by the key column; Spark re-ran the failed task
    # (spark.task.maxFailures is 4 on a cluster) but no row was called twice
    error = report["raise_error"]
    assert error is not None and "not calling the peer again in attempt 4" in error, error
    first = "SparkCallError: call 'check' failed for name='n7': RemoteError: 7 is unlucky"
    assert first in proc.stderr  # the first attempt's error, in the driver's log
    checked = {n: c for (op, n), c in calls.items() if op == "check"}
    assert checked[7] == 1
    assert max(checked.values()) == 1

"""Spark test set-up: one local[2] session for the whole test session, peerwire servers on
a background loop thread of the test process, and a few handlers the executors import.

Test modules import the fixtures they use by their function names, e.g.
``from tests.spark_session import spark_fixture  # noqa: F401`` gives them ``spark``. Without
Java or PySpark the fixture fails (never skips) and says what to install.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import rpc

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

ONE_SPARK_AT_A_TIME = pytest.mark.xdist_group("spark")
"""On the tests that start Spark (this module's session, a Connect server, a cluster):
``make test`` runs pytest on every core (``-n auto --dist loadgroup``), and these run on
one worker, one after another. Two JVMs at once on 2 cores once made a 5-s Spark job
timeout fail; the session fixture is also started once, not once per worker."""

# (server scheme, client query) for the wire formats the Spark tests run over
FLAVOURS = {
    "gotalk": ("tcp+gotalk", ""),
    "chatter": ("tcp+sbs", "?dialect=HatChatter"),
    "chatter-legacy": ("tcp+sbs", "?dialect=Hat"),
}

# A small JVM: serial GC, little memory, no UI, two shuffle partitions, Arrow on.
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "768m",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.log.level": "ERROR",
}


def spark_env() -> dict[str, str]:
    """The environment Spark and its Python workers need: this interpreter, loopback, and
    the repository on the workers' path (for ``tests.spark_session:handlers``)."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), path) if p),
    }


def require_spark() -> None:
    """Fail with a clear message when Java 17+ or PySpark is missing."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        pytest.fail(
            "the Spark tests need Java 17 or newer on PATH (or JAVA_HOME): "
            "apt-get install openjdk-17-jre-headless",
            pytrace=False,
        )
    version = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    found = re.search(r'version "(\d+)', version.stderr + version.stdout)
    if not found or int(found.group(1)) < 17:
        pytest.fail(f"the Spark tests need Java 17 or newer, found: {version.stderr!r}")
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the Spark tests need the spark extra: pip install -e '.[spark]' ({exc})")


def connect_builder(remote: str, conf: dict[str, str]) -> Any:
    """A Spark Connect session builder for a local server (``remote="local[2]"``) with
    ``conf``: SQL settings on the session, the others (static: UI, driver memory, JVM
    options) passed to the spark-submit that starts the server's JVM, which is where they
    apply (a Connect session refuses to set them: CANNOT_MODIFY_CONFIG)."""
    from pyspark.sql import SparkSession

    static = {k: v for k, v in conf.items() if not k.startswith("spark.sql.")}
    flags = [f"--conf {shlex.quote(f'{k}={v}')}" for k, v in static.items()]
    os.environ["PYSPARK_SUBMIT_ARGS"] = " ".join([*flags, "pyspark-shell"])
    builder = SparkSession.builder.remote(remote)
    for key, value in conf.items():
        if key.startswith("spark.sql."):
            builder = builder.config(key, value)
    return builder


@pytest.fixture(scope="session", name="spark")
def spark_fixture() -> Iterator[Any]:
    """One classic local[2] session for every Spark test."""
    require_spark()
    from pyspark.sql import SparkSession

    saved = {key: os.environ.get(key) for key in spark_env()}
    os.environ.update(spark_env())  # read once, when the JVM and the context start
    try:
        builder = SparkSession.builder.master("local[2]").appName("peerwire-tests")
        for key, value in SPARK_CONF.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield session
    session.stop()


# --- peerwire servers on a loop thread ---------------------------------------------------


class LoopThread:
    """An asyncio loop in a daemon thread: the test process's peerwire servers live here,
    while Spark's Python workers (other processes) connect to them over 127.0.0.1."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def serve(
        self, scheme: str, registry: rpc.Registry, *, port: int = 0, **kwargs: Any
    ) -> rpc.Server:
        url = f"{scheme}://127.0.0.1:{port}"
        return self.run(rpc.serve(url, registry=registry, **kwargs).start())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():  # stopped: close it (left to the GC, it warns)
            self.loop.close()


@pytest.fixture(scope="session", name="loop_thread")
def loop_thread_fixture() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


class Served:
    """A server started for one test; ``url`` is what executors call. ``tls=True`` serves
    ``ssl+`` (pass ``ssl=`` a server context)."""

    def __init__(
        self,
        loop_thread: LoopThread,
        flavour: str,
        registry: rpc.Registry,
        *,
        tls: bool = False,
        **kw: Any,
    ) -> None:
        scheme, query = FLAVOURS[flavour]
        if tls:
            scheme = scheme.replace("tcp+", "ssl+")
        self.loop_thread = loop_thread
        self.connections = 0

        def on_connect(peer: rpc.Peer) -> None:
            self.connections += 1

        self.server = loop_thread.serve(scheme, registry, on_connect=on_connect, **kw)
        self.url = f"{scheme}://127.0.0.1:{self.server.url.port}{query}"

    def drop_connections(self) -> None:
        """Close every accepted connection (as a restarted server would)."""

        async def drop() -> None:
            peers = list(self.server.peers)
            for peer in peers:
                peer.abort()
            await asyncio.gather(*(asyncio.shield(p.closed) for p in peers))

        self.loop_thread.run(drop())

    def close(self) -> None:
        self.loop_thread.run(self.server.close(drain_timeout=1.0))


@pytest.fixture(name="serve_peer")
def serve_peer_fixture(loop_thread: LoopThread) -> Iterator[Callable[..., Served]]:
    """``serve_peer(flavour, registry, **serve_kwargs)``; every server is closed after the
    test."""
    started: list[Served] = []

    def start(flavour: str, registry: rpc.Registry, **kw: Any) -> Served:
        served = Served(loop_thread, flavour, registry, **kw)
        started.append(served)
        return served

    yield start
    for served in started:
        served.close()


# --- handlers executors import by path: "tests.spark_session:handlers" ---------------------

handlers = rpc.Registry()


@handlers.handle("double")
def double(value: float) -> float:
    return value * 2

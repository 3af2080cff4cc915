"""``rpc.loops``: the loop choice (auto/asyncio/uvloop, ``PEERWIRE_LOOP``), honoured by the
async tests (``pytest --loop``), the blocking facade's thread and Spark's worker loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rpc
from rpc import loops

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(60)


def module_of(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def test_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loops.ENV_VAR, raising=False)
    assert loops.resolve() == loops.resolve("auto") == "uvloop"  # the test extra installs it
    assert loops.resolve("asyncio") == "asyncio"
    assert loops.resolve("uvloop") == "uvloop"
    monkeypatch.setenv(loops.ENV_VAR, "asyncio")
    assert loops.resolve() == "asyncio"
    assert loops.resolve("uvloop") == "uvloop"  # a named choice wins over the environment
    monkeypatch.setenv(loops.ENV_VAR, "trio")
    with pytest.raises(loops.LoopUnavailable, match=r"unknown event loop 'trio' \(from \$"):
        loops.resolve()
    with pytest.raises(loops.LoopUnavailable, match="use one of auto, asyncio, uvloop"):
        loops.resolve("curio")


def test_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loops.ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # how Python marks a module unimportable
    assert loops.resolve("auto") == "asyncio"
    with pytest.raises(loops.LoopUnavailable, match=r"pip install 'peerwire\[speed\]'"):
        loops.loop_factory("uvloop")


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
def test_run_and_new_event_loop(choice: str) -> None:
    async def which() -> str:
        return module_of(asyncio.get_running_loop())

    assert loops.run(which(), choice) == choice
    loop = loops.new_event_loop(choice)
    try:
        assert module_of(loop) == choice
    finally:
        loop.close()


async def test_async_tests_run_on_the_loop_pytest_was_given(
    request: pytest.FixtureRequest,
) -> None:
    choice = request.config.getoption("--loop")
    expected = {choice} if choice != "both" else {"asyncio", "uvloop"}
    assert module_of(asyncio.get_running_loop()) in expected


CALLER_LOOP = """
import asyncio
import sys

import rpc
from rpc import blocking
from rpc.spark.worker import runtime

registry = rpc.Registry()


@registry.handle("loop")
def loop(value):
    return type(asyncio.get_running_loop()).__module__


with blocking.connect(sys.argv[1], registry=registry) as peer:
    print(peer.request("caller_loop"))  # the server asks our "loop" op which loop we run
print(type(runtime().loop).__module__)
"""


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
async def test_blocking_and_spark_loops_follow_peerwire_loop(choice: str) -> None:
    from tests.peers.worker_app import registry

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) as server:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CALLER_LOOP,
            str(server.url),
            cwd=ROOT,
            env={**os.environ, loops.ENV_VAR: choice},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(30):
                out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert process.returncode == 0, err.decode()
    blocking_loop, spark_loop = out.decode().split()
    expected = "uvloop" if choice == "uvloop" else "asyncio.unix_events"
    assert (blocking_loop, spark_loop) == (expected, expected)


def test_cli_rejects_a_bad_peerwire_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rpc.cli", "call", "tcp+gotalk://127.0.0.1:1", "echo"],
        cwd=ROOT,
        env={**os.environ, loops.ENV_VAR: "trio"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "unknown event loop 'trio'" in done.stderr

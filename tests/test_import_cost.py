"""What importing peerwire loads: hat-sbs (with hat-json, jsonschema and PyYAML, a third of
``import rpc``'s time) only once something speaks SBS (a Chatter connection, the Eventer),
so the CLI, Gotalk peers and Spark workers that never do start without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GOTALK_CALL = """
import asyncio, json, sys
import rpc

registry = rpc.Registry()
registry.handle("echo")(lambda params: params)

async def main():
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) as server:
        async with rpc.connect(str(server.url), registry=rpc.Registry()) as peer:
            assert await peer.request("echo", {"a": 1}) == {"a": 1}

asyncio.run(main())
print(json.dumps("hat.sbs" in sys.modules))
"""

CHATTER_SERVE = """
import asyncio, json, sys
import rpc

async def main():
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=rpc.Registry()):
        print(json.dumps("hat.sbs" in sys.modules))

asyncio.run(main())
"""


def loaded(code: str) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", ["rpc", "rpc.cli", "rpc.eventer"])
def test_importing_loads_no_hat_sbs(module: str) -> None:
    assert (
        loaded(f"import json, sys, {module}; print(json.dumps('hat.sbs' in sys.modules))") is False
    )


def test_a_gotalk_server_and_client_never_load_hat_sbs() -> None:
    assert loaded(GOTALK_CALL) is False


def test_a_chatter_server_reads_its_schemas_before_its_first_client() -> None:
    assert loaded(CHATTER_SERVE) is True

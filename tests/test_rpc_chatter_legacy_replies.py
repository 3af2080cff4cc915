"""A hat-chatter 0.5.11 (legacy) peer decodes every payload against its own schemas and
closes the whole connection on a type it does not know. Whatever goes wrong with one of
its calls (unknown op, a handler that raises, a handler returning plain bytes), the legacy
peer must stay connected and its later calls must still work; one over ``max_concurrent``
waits for a slot.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import hat.sbs
import pytest

import rpc
from tests.rpc_helpers import wait_until
from tests.test_chatter_interop import legacy_python
from wire import schemas

pytestmark = pytest.mark.interop

SCRIPT = Path(__file__).parent / "peers" / "legacy_chatter_script.py"
TYPES = ("MsgReq", "MsgRes", "Missing", "Fail", "Slow", "Release", "Raw")
PW_TEST = "module PwTest\n" + "".join(f"{t} = Bytes\n" for t in TYPES)


def registry(release: asyncio.Event) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("PwTest.MsgReq")
    def echo(data: bytes) -> rpc.Reply:
        return rpc.Reply("PwTest.MsgRes", data + b"!")

    @reg.handle("PwTest.Fail")
    def fail(data: bytes) -> rpc.Reply:
        raise ValueError("boom")

    @reg.handle("PwTest.Slow")
    async def slow(data: bytes) -> rpc.Reply:
        await release.wait()
        return rpc.Reply("PwTest.MsgRes", b"slow done")

    @reg.handle("PwTest.Raw")
    def raw(data: bytes) -> bytes:
        return b"plain bytes"

    @reg.handle_notification("PwTest.Release")
    def on_release(data: bytes) -> None:
        release.set()

    return reg


async def run_script(
    steps: list, release_when: Callable[[rpc.Server], object] | None = None
) -> list[dict]:
    """Serve on loopback (max_concurrent = 1), run the legacy script against it;
    ``release_when``: the ``Slow`` handler also ends once it holds for the server."""
    release = asyncio.Event()
    repo = hat.sbs.Repository(schemas.repository(), PW_TEST)
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0",
        registry=registry(release),
        options=rpc.Options(max_concurrent=1),
        sbs_repo=repo,
    ) as server:
        proc = await asyncio.create_subprocess_exec(
            legacy_python(),
            str(SCRIPT),
            f"tcp+sbs://127.0.0.1:{server.url.port}",
            json.dumps(steps),
            stdout=subprocess.PIPE,
        )
        if release_when is not None:
            await wait_until(lambda: release_when(server), 30)
            release.set()
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


def replies(lines: list[dict]) -> list[dict]:
    return [line for line in lines if "sent" not in line]


async def test_legacy_peer_script_control() -> None:
    """The harness itself: good calls are answered in their conversations."""
    lines = await run_script([["req", "MsgReq", "a"], ["recv"], ["req", "MsgReq", "b"], ["recv"]])
    assert replies(lines) == [
        {"type": "PwTest.MsgRes", "data": "a!", "conv": 0, "last": True},
        {"type": "PwTest.MsgRes", "data": "b!", "conv": 1, "last": True},
        {"open": True},
    ]


@pytest.mark.parametrize("bad_type", ["Missing", "Fail", "Raw"])
async def test_legacy_peer_survives_a_failed_call(bad_type: str) -> None:
    """Unknown op, a handler that raises, a handler returning plain bytes: no reply the
    legacy peer cannot read, so the next message it gets is the answer to its next call."""
    lines = await run_script([["req", bad_type, "x"], ["req", "MsgReq", "after"], ["recv"]])
    assert replies(lines) == [
        {"type": "PwTest.MsgRes", "data": "after!", "conv": 1, "last": True},
        {"open": True},
    ]


async def test_legacy_peers_call_over_max_concurrent_waits_for_the_slot() -> None:
    """Slow holds the only slot; the next call, over max_concurrent, waits for it (a legacy
    connection gets no retry results, as with ``retry_results=False``), kept unrun in the
    server's backlog until Slow ends, then answered; later calls work. It was refused with
    a PeerwireRpc.Retry, which a plain Hat peer cannot decode, so it was not sent, and the
    peer heard nothing of that call."""
    steps = [
        ["req", "Slow", "s"],
        ["req", "MsgReq", "waits"],
        ["recv"],
        ["recv"],
        ["req", "MsgReq", "later"],
        ["recv"],
    ]

    def waits(server: rpc.Server) -> bool:
        return any(peer._backlog for peer in server.peers)  # "waits", kept unrun

    assert replies(await run_script(steps, release_when=waits)) == [
        {"type": "PwTest.MsgRes", "data": "slow done", "conv": 0, "last": True},
        {"type": "PwTest.MsgRes", "data": "waits!", "conv": 1, "last": True},
        {"type": "PwTest.MsgRes", "data": "later!", "conv": 2, "last": True},
        {"open": True},
    ]

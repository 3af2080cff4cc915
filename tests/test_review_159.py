"""Defects found by helper-159's review of b11d5c7..eb9ca2a; each test fails on the code it
was written against, and is bounded in time."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import eventer
from tests.peers.eventer_helpers import running_server, url_of
from tests.test_cli_hunt155 import chatter_server
from tests.test_top import answering, http_ok, metrics_text

ROOT = Path(__file__).resolve().parent.parent


def test_a_failure_with_stderr_closed_does_not_go_to_stdout() -> None:
    """``peerwire call ... 2>&-`` (fd 2 closed) that fails writes its failure line nowhere,
    never into stdout, which a script reads results from. Python sets ``sys.stderr`` to None
    then, and ``print(..., file=None)`` writes to ``sys.stdout``: the line "peerwire: cannot
    connect to ..." came out as if it were the call's result (exit 3 all the same)."""
    with socket.socket() as bound:  # bound, not listening: the connection is refused
        bound.bind(("127.0.0.1", 0))
        url = f"tcp+gotalk://127.0.0.1:{bound.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-m", "rpc.cli", "call", url, "echo", '"x"', "--timeout", "5"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            preexec_fn=lambda: os.close(2),
            timeout=60,
            text=True,
        )
    assert done.returncode == 3
    assert done.stdout == "", done.stdout


async def test_top_with_its_stdout_closed_is_no_unexpected_failure() -> None:
    """``peerwire top URL >&-`` (no ``--plain``) scrapes and exits 0, its frame going
    nowhere, as call and stream do with a closed stdout. Before, ``run`` asked the None that
    ``sys.stdout`` is then whether it is a terminal: "AttributeError: 'NoneType' object has
    no attribute 'isatty'", exit 1 (``--plain`` did not ask, and passed)."""
    reply = http_ok(metrics_text(10, 1, 5, 100).encode())
    server = await answering({b"/metrics": reply})
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    try:  # subprocess's preexec_fn: uvloop's child sets its stdio up after it
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "rpc.cli", "top", url, "--count", "1"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: os.close(1),
            timeout=30,
        )
    finally:
        server.close()
        await server.wait_closed()
    assert (done.returncode, done.stderr) == (0, b"")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_call_into_a_full_disk_through_a_buffered_stdout_exits_1() -> None:
    """``peerwire call URL OP > file`` on a full disk, stdout buffered as Python makes it
    for a file (no PYTHONUNBUFFERED): exit 1, "cannot write the output", as docs/cli.md
    says. Before, the result only went into stdout's buffer, the call returned 0, and the
    interpreter's exit failed to flush it: exit 120, "Exception ignored in: <_io.TextIOWrapper
    name='<stdout>'...>" (the in-process test wrote through a line-buffered file)."""
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full, chatter_server(registry) as (url, _, _):
        done = subprocess.run(
            [sys.executable, "-m", "rpc.cli", "call", url, "echo", '"x"', "--timeout", "10"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            env=env,
            timeout=60,
            text=True,
        )
    assert (done.returncode, done.stderr) == (
        1,
        "peerwire: cannot write the output: [Errno 28] No space left on device\n",
    )


async def test_an_eventer_close_cancelled_midway_still_closes_the_client(tmp_path: Path) -> None:
    """An Eventer client's close() cancelled while it closes the connection (a timeout
    around it; the task of an ``async with`` cancelled in its exit) still leaves the client
    closed: ``closed`` resolves, its iterators end, and close() again returns. Before, the
    cancel skipped _finish(), and the connection's CLOSED state, ignored while closing, did
    not make up for it: ``closed`` never resolved, an ``events()`` reader waited for good,
    and a second close() too (it waits on ``closed``)."""
    async with running_server(tmp_path) as server:
        client = await eventer.connect(url_of(server), "reader", subscriptions=[("n", "*")])
        events = client.events()
        closing = asyncio.ensure_future(client.close())
        await asyncio.sleep(0)  # into the connection's close, which waits
        assert not closing.done()
        closing.cancel()
        await asyncio.wait([closing])
        await asyncio.wait_for(asyncio.shield(client.closed), 2)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(events.__anext__(), 2)
        await asyncio.wait_for(client.close(), 2)

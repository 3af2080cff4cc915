"""The blocking client in a child made by ``os.fork()`` (a multiprocessing pool's fork start
method, a pre-forking server): the background loop's thread does not come along, so each
call handed to it waited for good, a new ``rpc.blocking.connect`` in the child too. Now the
child starts a loop of its own; what it inherited is the parent's and raises
ConnectionClosed (a call, a stream's next()), or closes as a no-op.

The server runs on a loop of its own thread; the blocking client on rpc.blocking's
background loop (uvloop with ``--loop uvloop``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
from typing import Any

import pytest

import rpc
from tests.test_blocking_stream import serving

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")


def outcome(call: Any) -> str:
    try:
        return repr(call())
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def in_child(url: str, peer: rpc.blocking.BlockingPeer, results: Any) -> dict[str, str]:
    """What the child sees (run in it; bounded by an alarm that kills it)."""
    signal.alarm(5)
    seen = {
        "state": peer.connection_state.value,
        "request": outcome(lambda: peer.request("echo", "old")),
        "next": outcome(lambda: next(results)),
        "close": outcome(peer.close),
    }
    with rpc.blocking.connect(url, reconnect=False) as fresh:
        seen["fresh"] = outcome(lambda: fresh.request("echo", "fresh"))
    return seen


def test_a_forked_child_connects_anew_and_refuses_the_parents_client() -> None:
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @registry.handle("count")
    async def count(n: int) -> Any:
        for i in range(n):
            yield i

    with serving(registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        results = peer.stream("count", value=3)
        assert next(results) == 0
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave at once (no pytest clean-up here)
            code = 1
            try:
                os.close(read)
                os.write(write, json.dumps(in_child(url, peer, results)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        try:
            ready, _, _ = select.select([read], [], [], 10)
            report = os.read(read, 65_536) if ready else b""
        finally:
            os.close(read)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # gone already, unless it hangs
            _, status = os.waitpid(pid, 0)
        assert report, f"the child never answered (status {status}): a call hangs in it"
        seen = json.loads(report)
        forked = "ConnectionClosed: this blocking client was made before os.fork()"
        assert seen["state"] == "closed"
        assert seen["request"].startswith(forked)
        assert seen["next"].startswith(forked)
        assert seen["close"] == "None"
        assert seen["fresh"] == "'fresh'"
        # the parent's client and stream go on
        assert peer.request("echo", "parent") == "parent"
        assert list(results) == [1, 2]

"""Defects found in the ``peerwire`` command line: each test fails on the code it was written
against, and is bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import rpc
from rpc import cli, loops


@pytest.mark.parametrize("option", ["--timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_number_of_seconds_above_0_is_a_usage_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the option named, before connecting (port 9 refuses: exit 3 had it
    tried). Before, only a word was refused: ``--timeout nan`` waited without bound,
    ``--timeout -1`` or ``0`` failed every call at once (exit 4, "no result within -1.0 s"),
    ``--connect-timeout -1`` exited 3 saying connecting timed out, and
    ``--connect-timeout nan`` exited 1 with a ValueError."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["call", "tcp+gotalk://127.0.0.1:9", "echo", option, value])
    assert exited.value.code == 2
    assert option in capsys.readouterr().err


@contextlib.contextmanager
def chatter_server(registry: rpc.Registry) -> Iterator[tuple[str, asyncio.AbstractEventLoop, Any]]:
    """A legacy-dialect Chatter server on its own loop thread: its URL, loop and server."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = stop = asyncio.Event()
        async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry) as server:
            state["url"], state["server"] = str(server.url), server
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loops.run, args=(main(),))
    thread.start()
    assert ready.wait(10)
    try:
        yield state["url"], state["loop"], state["server"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)


def test_a_stream_cut_after_its_results_came_gives_no_dialect_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A Chatter stream in the legacy dialect whose connection is cut after a result came
    (the server crashed or restarted) exits 3, saying the connection failed, with no hint
    that the peer speaks the other dialect: a result came, so it speaks this one. Before,
    every failure of such a connection said "the peer probably speaks the current Chatter
    dialect ... try ...?dialect=HatChatter", sending an operator after the wrong cause."""
    registry = rpc.Registry()
    sent = threading.Event()

    @registry.handle("one")
    async def one(_: Any) -> Any:
        yield 1
        sent.set()
        await asyncio.get_running_loop().create_future()

    with chatter_server(registry) as (url, loop, server):
        codes: list[int] = []
        cli_thread = threading.Thread(
            target=lambda: codes.append(cli.main(["stream", url, "one", "--timeout", "10"]))
        )
        cli_thread.start()
        assert sent.wait(10)

        def cut() -> None:
            for peer in list(server.peers):
                peer.abort()

        loop.call_soon_threadsafe(cut)
        cli_thread.join(10)
    assert codes == [3]
    out, err = capsys.readouterr()
    assert out == "1\n"
    assert "connection failed" in err and "dialect" not in err, err

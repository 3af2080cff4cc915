"""Defects found in the ``peerwire`` command line: each test fails on the code it was written
against, and is bounded in time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import cli, loops
from tests.rpc_helpers import served_on_thread
from tests.test_top import top_process

ROOT = Path(__file__).resolve().parent.parent


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


def chatter_server(registry: rpc.Registry) -> Any:
    """A legacy-dialect Chatter server on its own loop thread: its URL, loop and server."""
    return served_on_thread(registry, "tcp+sbs://127.0.0.1:0")


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


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", ["call", "stream"])
def test_output_that_cannot_be_written_exits_1_not_as_a_connection_failure(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout on a full disk (/dev/full: every write fails with ENOSPC) exits 1 saying the
    output cannot be written. Before, the OSError was taken for the connection's: exit 3,
    "connection failed: [Errno 28] No space left on device", with a Chatter dialect hint."""
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    with open("/dev/full", "w", buffering=1) as full, chatter_server(registry) as (url, _, _):
        monkeypatch.setattr(sys, "stdout", full)
        code = cli.main([command, url, "echo", '"x"', "--timeout", "10"])
        monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 1, err
    assert "cannot write the output" in err and "connection" not in err, err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvloop: in the test extra
@pytest.mark.parametrize("command", ["call", "stream"])
def test_a_client_command_with_its_stdout_closed_does_not_abort(command: str, loop: str) -> None:
    """``peerwire call ... >&-`` (fd 1 closed): the connection's socket took fd 1 and uvloop
    (the default loop, when installed) aborted as it closed it (SIGABRT, "Assertion
    fd > STDERR_FILENO"); ``serve`` opened
    /dev/null on closed fds 0-2 already, the client commands did not. Now they do: exit 0
    (the result goes nowhere, as Python's print does without a stdout); ``stream`` flushed
    the None that ``sys.stdout`` is then (AttributeError, exit 1)."""
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    with chatter_server(registry) as (url, _, _):
        done = subprocess.run(
            [sys.executable, "-m", "rpc.cli", command, url, "echo", '"x"'],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: os.close(1),
            env={**os.environ, loops.ENV_VAR: loop},
            timeout=60,
            text=True,
        )
    assert done.returncode == 0, (done.returncode, done.stderr)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
async def test_top_into_a_full_disk_is_not_a_scrape_failure() -> None:
    """``peerwire top URL --plain > file`` on a full disk exits 1, "cannot write the
    output", as call and stream do. Before: "cannot read URL: [Errno 28] No space left on
    device", exit 3, an operator sent to look at a server that answered."""
    with open("/dev/full", "wb") as full:
        async with top_process(full, "--count", "1") as process:
            async with asyncio.timeout(30):
                _, err = await process.communicate()
    assert process.returncode == 1, err.decode()
    assert "cannot write the output" in err.decode(), err.decode()


def test_a_peers_error_text_is_one_line_without_terminal_escapes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An error result whose text holds a newline, a carriage return and terminal escapes
    (set the title, clear the screen) is said in one line on stderr, those characters
    escaped (``\\x1b``, ``\\n``), as docs/cli.md promises ("every failure is one line").
    Before, the peer's text went to the operator's terminal as it came: a second line, and
    escape sequences run by the terminal."""
    registry = rpc.Registry()

    @registry.handle("evil")
    def evil(_: Any) -> None:
        raise RuntimeError("\x1b]0;pwned\x07\x1b[2J\rall good\nsecond line")

    with chatter_server(registry) as (url, _, _):
        code = cli.main(["call", url, "evil", "--timeout", "10"])
    err = capsys.readouterr().err
    assert code == 5, err
    assert err.count("\n") == 1 and err.endswith("\n"), repr(err)
    assert not any(c in err[:-1] for c in "\x1b\x07\r\n"), repr(err)
    assert "\\x1b[2J\\rall good\\nsecond line" in err, repr(err)

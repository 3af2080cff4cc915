"""``python -m rpc.eventer serve --config FILE`` as a real process: TOML and JSON configs,
clean stop on SIGTERM, persistence across restarts, config and database errors."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import cli
from tests.peers.eventer_helpers import json_event

ROOT = Path(__file__).resolve().parents[1]


async def start(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rpc.eventer",
        "serve",
        "--config",
        str(config),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
    assert line.startswith("listening on "), line
    return proc, line.split()[-1]


async def stop(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(proc.wait(), 20)


async def test_serve_toml_then_json_on_the_same_database(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(
        'listen = ["tcp+sbs://127.0.0.1:0?dialect=HatChatter"]\n'
        'server_id = 5\ntoken = "tok"\ndatabase = "events.db"\n'
    )
    proc, url = await start(tmp_path / "a.toml")
    try:
        assert url.startswith("tcp+sbs://127.0.0.1:") and "dialect=HatChatter" in url
        async with await eventer.connect(url, "cli/one", client_token="tok") as client:
            registered = await client.register([json_event(("c", "1"), 1)], with_response=True)
            assert registered is not None and registered[0].id.server == 5
        with pytest.raises(eventer.EventerInitError):
            await eventer.connect(url, "cli/bad", client_token="nope")
    finally:
        assert await stop(proc) == 0
    assert (tmp_path / "events.db").exists()

    (tmp_path / "b.json").write_text(
        json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "server_id": 5, "database": "events.db"})
    )
    proc, url = await start(tmp_path / "b.json")
    try:
        async with await eventer.connect(url + "?dialect=HatChatter", "cli/two") as client:
            result = await client.query(eventer.QueryLatestParams([("c", "1")]))
            assert result.events == registered
    finally:
        assert await stop(proc) == 0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rpc.eventer", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_config_and_database_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('listen = "tcp+gotalk://127.0.0.1:0"\n')
    result = run_cli("serve", "--config", str(tmp_path / "bad.toml"))
    assert result.returncode == 2 and "not a Chatter" in result.stderr

    (tmp_path / "junk.db").write_text("this is no database " * 100)
    (tmp_path / "c.json").write_text('{"listen": "tcp+sbs://127.0.0.1:0", "database": "junk.db"}')
    result = run_cli("serve", "--config", str(tmp_path / "c.json"))
    assert result.returncode == 3 and "junk.db" in result.stderr

    result = run_cli("serve")
    assert result.returncode == 2 and "--config" in result.stderr


@pytest.mark.parametrize("cli_module", ["rpc.eventer", "rpc.cli"])
def test_a_database_it_cannot_open_is_one_line_and_exit_3(tmp_path: Path, cli_module: str) -> None:
    """``python -m rpc.eventer serve`` and ``peerwire eventer serve`` name the path and why."""
    prefix = ["eventer"] if cli_module == "rpc.cli" else []
    cases = {
        "missing/events.db": f"no such directory {tmp_path / 'missing'}",
        "a-directory": "it is a directory",
    }
    (tmp_path / "a-directory").mkdir()
    for database, reason in cases.items():
        config = tmp_path / "c.json"
        config.write_text(json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "database": database}))
        result = subprocess.run(
            [sys.executable, "-m", cli_module, *prefix, "serve", "--config", str(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        path = tmp_path / database
        assert result.returncode == cli.EXIT_FAILED == 3, result.stderr
        assert result.stderr.splitlines() == [
            f"peerwire eventer: cannot open database {path}: {reason}"
        ]
        assert result.stdout == ""


def test_add_parser_hooks_into_a_parent_cli() -> None:
    parser = argparse.ArgumentParser(prog="peerwire")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(["eventer", "serve", "--config", "x.toml", "-v"])
    assert args.func is cli.run_serve and args.config == "x.toml" and args.verbose
    with pytest.raises(SystemExit):
        parser.parse_args(["eventer"])


@pytest.mark.interop
async def test_sigterm_announces_stopping_then_standby(tmp_path: Path) -> None:
    """As hat-event's engine runner: STOPPING, the queued events committed, then STANDBY,
    before the connections close (hat's own client runner waits for STANDBY)."""
    from hat.drivers import net
    from hat.event import common as hat
    from hat.event import eventer as hat_eventer

    (tmp_path / "s.json").write_text(
        json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "events_ack": True, "database": "s.db"})
    )
    proc, url = await start(tmp_path / "s.json")
    port = int(url.rsplit(":", 1)[1])
    theirs: list[hat.Status] = []
    ours: list[eventer.Status] = []
    hat_client = await hat_eventer.connect(
        net.TcpAddress("127.0.0.1", port), "hat/stop", status_cb=lambda _c, s: theirs.append(s)
    )
    client = await eventer.connect(url, "pw/stop", status_cb=lambda _c, s: ours.append(s))
    await hat_client.register([hat.RegisterEvent(("q",), None, None)])  # just before SIGTERM
    assert await stop(proc) == 0
    await asyncio.wait_for(hat_client.wait_closed(), 10)
    await asyncio.wait_for(asyncio.shield(client.closed), 10)
    assert theirs == [hat.Status.STOPPING, hat.Status.STANDBY]
    assert ours == [eventer.Status.OPERATIONAL, eventer.Status.STOPPING, eventer.Status.STANDBY]


def test_serve_help_names_every_config_key(capsys: pytest.CaptureFixture[str]) -> None:
    """The help lists the config file's keys from the config itself: a key added there is
    never missing here (max_pending_bytes and max_wal_bytes once were)."""
    parser = argparse.ArgumentParser()
    cli._add_commands(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key in eventer.ServerConfig.__struct_fields__:
        assert key in text, key

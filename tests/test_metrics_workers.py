"""``peerwire serve --workers N --metrics HOST:PORT`` (:func:`rpc.workers.serve_workers` with
``metrics=``): one scrape shows every worker (prometheus-client's multiprocess mode).
Counters add up over the workers, open connections are summed over live ones, a killed
worker's calls still count, and the temporary directory is gone after the server stops."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import rpc
from tests.test_metrics import Scrape, scrape
from tests.test_workers import SERVE, Running, answering_pids, ask

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(sys.platform == "win32", reason="worker processes need fork (POSIX)"),
]


async def scraped(port: int, done: Any, timeout: float = 10) -> Scrape:
    """Scrape until ``done(scrape)`` holds (connections close asynchronously)."""
    async with asyncio.timeout(timeout):
        while True:
            result = await asyncio.to_thread(scrape, port)
            if done(result):
                return result
            await asyncio.sleep(0.05)


async def one_connection_per_worker(url: str, count: int) -> tuple[dict[int, Any], int]:
    """Open connections (one ``pid`` call each) until ``count`` workers answered; keep one
    open per worker, close the others. (peers by pid, calls made)"""
    held: dict[int, Any] = {}
    calls = 0
    async with asyncio.timeout(30):
        while len(held) < count:
            peer = await rpc.connect(url, connect_timeout=5, reconnect=False)
            pid = await peer.request("pid", timeout=10)
            calls += 1
            if pid in held:
                await peer.close()
            else:
                held[pid] = peer
    return held, calls


async def test_one_scrape_shows_every_worker(tmp_path: Path) -> None:
    env = ["env", f"TMPDIR={tmp_path}"]
    server = Running([*env, *SERVE, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0",
                      "--metrics=127.0.0.1:0"])  # fmt: skip
    held: dict[int, Any] = {}
    try:
        [line] = await asyncio.to_thread(server.wait_lines, "stdout", "metrics on ")
        port = urllib.parse.urlsplit(line.split()[-1]).port
        assert port
        [url] = await asyncio.to_thread(server.urls, 1)
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith("-peerwire-metrics")]

        held, connected = await one_connection_per_worker(url, 2)
        calls = connected
        for peer, more in zip(held.values(), (3, 4), strict=True):
            for _ in range(more):
                await peer.request("pid", timeout=10)
            calls += more
        both = await scraped(port, lambda s: s.value("peerwire_connections_open") == 2)
        assert both.value("peerwire_requests_total", side="server", op="pid") == calls
        assert both.value("peerwire_request_duration_seconds_count", op="pid") == calls
        assert both.value("peerwire_connections_accepted_total", protocol="gotalk") == connected

        # a worker killed: the parent drops its live gauges, its counts stay in the totals
        victim = min(held)
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(
            server.wait_lines, "stderr", f"(pid {victim}) exited with signal SIGKILL"
        )
        one = await asyncio.to_thread(scrape, port)
        assert one.value("peerwire_connections_open") == 1
        assert one.value("peerwire_requests_total", side="server", op="pid") == calls
        survivor = held[max(held)]
        assert await survivor.request("pid", timeout=10) == max(held)
        assert await ask(url, "pid") != victim  # a new connection: survivor or replacement
        calls += 2
        after = await scraped(
            port, lambda s: s.value("peerwire_requests_total", side="server", op="pid") == calls
        )
        assert after.value("peerwire_connections_accepted_total") == connected + 1

        # the stop waits for the victim's replacement to serve (an answer from neither the
        # victim nor the survivor): stopped while it started, it would exit by SIGTERM too,
        # a second "exited" line (review 222)
        async with asyncio.timeout(20):
            while await ask(url, "pid") == max(held):  # new connections, spread by the kernel
                pass
    finally:
        for peer in held.values():
            await peer.close()
        code = await asyncio.to_thread(server.stop)
        server.kill()
    assert code == 0, server.output("stderr")
    exits = [line for line in server.output("stderr").splitlines() if "exited" in line]
    assert len(exits) == 1 and f"(pid {victim})" in exits[0], exits  # the exporter never did
    assert list(tmp_path.iterdir()) == []  # the parent removed its multiprocess directory


def listening_inode(port: int) -> str:
    """The inode of the socket listening on 127.0.0.1:``port`` (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def holds_socket(pid: int, inode: str) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fds / fd) == f"socket:[{inode}]" for fd in os.listdir(fds))


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
async def test_only_the_exporter_holds_the_metrics_socket() -> None:
    server = Running([*SERVE, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0",
                      "--metrics=127.0.0.1:0"])  # fmt: skip
    try:
        [line] = await asyncio.to_thread(server.wait_lines, "stdout", "metrics on ")
        port = urllib.parse.urlsplit(line.split()[-1]).port
        assert port
        [url] = await asyncio.to_thread(server.urls, 1)
        workers = await answering_pids(url, lambda pids: len(pids) == 2)
        pid = server.process.pid
        children = {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
        [exporter] = children - workers
        inode = listening_inode(port)
        assert holds_socket(exporter, inode)
        assert holds_socket(pid, inode)  # the parent, for the exporter it would restart
        for worker in workers:
            assert not holds_socket(worker, inode), f"worker {worker} holds the metrics port"
    finally:
        code = await asyncio.to_thread(server.stop)
        server.kill()
    assert code == 0, server.output("stderr")


def test_metrics_address_taken_exits_3() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = Running([*SERVE, "--workers=2", "--listen=tcp+gotalk://127.0.0.1:0",
                          f"--metrics=127.0.0.1:{port}"])  # fmt: skip
        try:
            assert server.process.wait(timeout=30) == 3
            server.stop()  # exited already: collects its output
        finally:
            server.kill()
    assert f"(metrics: 127.0.0.1:{port})" in server.output("stderr")

"""Metrics of several worker processes in one scrape (prometheus-client's multiprocess
mode), as ``peerwire serve --workers N --metrics`` gives them: counters add up over the
workers, open connections are summed over live ones, a killed worker's calls still count."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import rpc
from tests.test_metrics import scrape

SCRIPT = Path(__file__).with_name("metrics_workers.py")


class Workers:
    def __init__(self, directory: Path, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(directory), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ports: list[int] = []
        for _ in range(count):
            _, _, _, port = self._line("WORKER")
            self.ports.append(int(port))
        self.metrics_port = int(self._line("METRICS")[1])

    def _line(self, word: str) -> list[str]:
        assert self.proc.stdout is not None
        fields = self.proc.stdout.readline().split()
        if not fields or fields[0] != word:
            self.close()
            raise AssertionError(f"expected {word}, got {fields}")
        return fields

    def kill(self, index: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"kill {index}\n")
        self.proc.stdin.flush()
        self._line("KILLED")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def test_one_scrape_shows_every_worker(tmp_path: Path) -> None:
    workers = Workers(tmp_path / "metrics", 2)
    try:
        peers: list[Any] = []
        for port, calls in zip(workers.ports, (3, 4), strict=True):
            url = f"tcp+gotalk://127.0.0.1:{port}"
            peer = await rpc.connect(url, registry=rpc.Registry(), reconnect=False)
            peers.append(peer)
            for i in range(calls):
                assert await peer.request("echo", i) == i
        both = scrape(workers.metrics_port)
        assert both.value("peerwire_requests_total", side="server", op="echo") == 7
        assert both.value("peerwire_connections_open", protocol="gotalk") == 2
        assert both.value("peerwire_connections_accepted_total") == 2
        assert both.value("peerwire_request_duration_seconds_count", op="echo") == 7

        workers.kill(0)
        one = scrape(workers.metrics_port)
        assert one.value("peerwire_connections_open", protocol="gotalk") == 1
        assert one.value("peerwire_requests_total", side="server", op="echo") == 7
        await asyncio.wait_for(peers[0].closed, 10)
        assert await peers[1].request("echo", "more") == "more"
        assert scrape(workers.metrics_port).value("peerwire_requests_total", op="echo") == 8
        await peers[1].close()
    finally:
        workers.close()

"""``peerwire serve --metrics`` and ``peerwire top``: a real server process exposing metrics,
a client calling it, and the live view (plain text) reading them back."""

from __future__ import annotations

import asyncio
import re

import rpc
from rpc import top
from tests.test_cli import Serving, run_cli
from tests.test_metrics import scrape


def test_quantiles_interpolate_inside_buckets() -> None:
    buckets = {0.001: 0.0, 0.01: 10.0, 0.1: 20.0, float("inf"): 20.0}
    assert abs(top.quantile(0.5, buckets) - 0.01) < 1e-12  # type: ignore[operator]
    assert abs(top.quantile(0.25, buckets) - 0.0055) < 1e-12  # type: ignore[operator]
    assert abs(top.quantile(0.75, buckets) - 0.055) < 1e-12  # type: ignore[operator]
    assert top.quantile(0.99, {0.1: 0.0, float("inf"): 4.0}) == 0.1  # past the last bound
    assert top.quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert top.metrics_url("127.0.0.1:9100") == "http://127.0.0.1:9100/metrics"
    assert top.metrics_url("http://h:1/x") == "http://h:1/x"


async def test_serve_metrics_and_top() -> None:
    with Serving("examples/greet.py", "--listen", "tcp+gotalk://127.0.0.1:0", "--metrics",
                 "127.0.0.1:0") as server:  # fmt: skip
        metrics_url = server.next_line("metrics on ").split()[-1]
        (url,) = server.urls(1)
        port = int(re.search(r":(\d+)/metrics$", metrics_url).group(1))  # type: ignore[union-attr]
        async with rpc.connect(url) as peer:
            calls = 0
            stop = asyncio.Event()

            async def keep_calling() -> None:
                nonlocal calls
                while not stop.is_set():
                    await peer.request("greet", {"name": "Ada"})
                    calls += 1
                    await asyncio.sleep(0.01)  # a steady load, not synchronisation

            caller = asyncio.create_task(keep_calling())
            try:
                code, out, err = await run_cli(
                    "top", metrics_url, "--count", "3", "--interval", "0.3", "--plain"
                )
            finally:
                stop.set()
                await caller
            assert code == 0, err
            assert scrape(port).value("peerwire_requests_total", op="greet") == calls
        frames = [f for f in out.split("\n\n") if f.strip()]
        assert len(frames) == 3
        for frame in frames:
            assert frame.startswith(f"peerwire top {metrics_url}")
            assert "connections open 1" in frame
            assert re.search(r"^op\s+calls/s\s+errors\s+p50\s+p90\s+p99\s+total$", frame, re.M)
        later = re.search(r"^greet\s+([\d,.]+)\s+(\S+)\s+([\d.]+ ms)", frames[-1], re.M)
        assert later is not None, frames[-1]
        assert float(later.group(1).replace(",", "")) > 0  # calls/s over the last interval
        assert later.group(2) == "0.0%"
        assert server.stop() == 0


async def test_top_of_nothing_exits_3() -> None:
    code, _, err = await run_cli("top", "127.0.0.1:1", "--count", "1", "--plain")
    assert code == 3
    assert "cannot read 127.0.0.1:1" in err

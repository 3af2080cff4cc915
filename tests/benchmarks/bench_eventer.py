"""Eventer throughput: peerwire's server (SQLite) vs hat-event 0.9.44's full server (lmdb).

    .venv/bin/python tests/benchmarks/bench_eventer.py [--quick | --smoke]

Each server runs in its own process on 127.0.0.1; this process is the load. The load uses
raw Chatter peers sending PRE-ENCODED HatEventer messages, identical bytes to both
servers, so the figures measure the servers, not a client library:

- registered events/s, register requests pipelined (all sent, the last with a response;
  the clock stops at that response), batches of 1 and of 100 events;
- the same with one request at a time (each waits for its response);
- fan-out: 10 subscribers of ``bench/*``; pipelined registration; the clock stops when
  every subscriber has received every event. Reported as events delivered/s (sum over
  subscribers).

Durability differs in the servers' favour of the reference: ours answers and notifies only
after an SQLite commit with synchronous=FULL (fsync); the reference answers before its lmdb
flush (flush_period 1 s here).

``--smoke`` (CI) does a hundredth of the work and queries 10,000 stored events: every row
runs and is compared with hat-event as usual, but the figures are rough.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import rpc  # noqa: E402
from rpc.eventer import EventerServer, ServerConfig, common, connect  # noqa: E402

HAT_SERVER = ROOT / "tests" / "peers" / "eventer_hat_server.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ours(tmp: Path, sync: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    config = tmp / f"eventer-{sync}.json"
    listen = f"tcp+sbs://127.0.0.1:{port}"
    config.write_text(
        json.dumps({"listen": listen, "server_id": 1, "database": f"ours-{sync}.db", "sync": sync})
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "rpc.eventer", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on"):
        proc.kill()
        raise RuntimeError(f"our server did not start: {line!r}")
    return proc, port


def start_reference(tmp: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HAT_SERVER), str(port), str(tmp / "hat.lmdb")],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"reference server did not start: {line!r}")
    return proc, port


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def array_count(data: bytes) -> int:
    """The element count that starts an SBS Array (an SBS Integer)."""
    value = 0
    for i, byte in enumerate(data):
        value = (value << 7) | (byte & 0x7F)
        if byte & 0x80:
            if data[0] & 0x40:
                value -= 1 << (7 * (i + 1))
            return value
    raise ValueError("truncated integer")


async def open_peer(
    port: int, name: str, subscriptions: list[tuple[str, ...]], registry: rpc.Registry
) -> rpc.Peer:
    peer = await rpc.connect(
        f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter",
        registry=registry,
        sbs_repo=common.peer_repository(),
    )
    init = common.encode(
        common.MSG_INIT_REQ, common.init_req_to_sbs(name, None, subscriptions, None, False)
    )
    res = await peer.request(common.MSG_INIT_REQ, init, raw=True)
    kind, status = common.decode(common.MSG_INIT_RES, res)
    assert kind == "success" and status[0] == "operational", (kind, status)
    return peer


def register_message(batch: int) -> bytes:
    events = [
        common.register_event_to_sbs(
            common.RegisterEvent(
                ("bench", "x", str(i % 50)), common.now(), common.EventPayloadJson({"v": i})
            )
        )
        for i in range(batch)
    ]
    return common.encode(common.MSG_REGISTER_REQ, events)


async def pipelined(peer: rpc.Peer, message: bytes, count: int) -> float:
    start = time.perf_counter()
    for i in range(count - 1):
        peer.notify(common.MSG_REGISTER_REQ, message)
        if i % 256 == 255:
            await asyncio.sleep(0)  # let the transport drain
    res = await peer.request(common.MSG_REGISTER_REQ, message, raw=True, timeout=300)
    elapsed = time.perf_counter() - start
    assert common.decode(common.MSG_REGISTER_RES, res)[0] == "events"
    return elapsed


async def sequential(peer: rpc.Peer, message: bytes, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        res = await peer.request(common.MSG_REGISTER_REQ, message, raw=True, timeout=60)
        assert res[:1] == b"\x80"  # Choice index 0: events
    return time.perf_counter() - start


async def fan_out(port: int, message: bytes, count: int, batch: int, subscribers: int) -> float:
    total = count * batch
    done = asyncio.Event()
    remaining = [subscribers]
    peers = []
    for n in range(subscribers):
        registry = rpc.Registry()
        received = [0]

        def on_events(data: bytes, received: list[int] = received) -> None:
            received[0] += array_count(data)
            if received[0] == total:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        registry.handle_notification(common.MSG_EVENTS_NOTIFY)(on_events)
        peers.append(await open_peer(port, f"bench/sub{n}", [("bench", "*")], registry))
    loader = await open_peer(port, "bench/load", [], rpc.Registry())
    start = time.perf_counter()
    await pipelined(loader, message, count)
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - start
    for peer in [loader, *peers]:
        await peer.close()
    return elapsed


async def measure(port: int, scale: float) -> dict[str, float]:
    """Every row's rate, on ``scale`` times the full work (at least one request each)."""
    results: dict[str, float] = {}
    peer = await open_peer(port, "bench/load", [], rpc.Registry())
    one, hundred = register_message(1), register_message(100)
    await pipelined(peer, one, 200)  # warm-up
    n = int(20_000 * scale)
    results["pipelined, batch 1 (events/s)"] = n / await pipelined(peer, one, n)
    n = int(1_000 * scale)
    results["pipelined, batch 100 (events/s)"] = n * 100 / await pipelined(peer, hundred, n)
    n = int(2_000 * scale)
    results["one at a time, batch 1 (events/s)"] = n / await sequential(peer, one, n)
    n = int(300 * scale)
    results["one at a time, batch 100 (events/s)"] = n * 100 / await sequential(peer, hundred, n)
    await peer.close()
    n = int(5_000 * scale)
    results["fan-out to 10, batch 1 (deliveries/s)"] = n * 10 / await fan_out(port, one, n, 1, 10)
    n = int(300 * scale)
    results["fan-out to 10, batch 100 (deliveries/s)"] = (
        n * 100 * 10 / await fan_out(port, hundred, n, 100, 10)
    )
    return results


async def million(tmp: Path, total: int) -> list[tuple[str, float, int]]:
    """Fill our server with ``total`` events (1000 types, one rare type, half with source
    timestamps) and time queries over loopback: median ms of 20 runs."""
    config = ServerConfig(
        listen=["tcp+sbs://127.0.0.1:0"],
        database=str(tmp / "million.db"),
        sync="normal",
        system_events=False,
    )
    async with EventerServer(config) as server:
        batch = 1000
        pending: list[asyncio.Future[Any]] = []
        for b in range(total // batch):
            events = [
                common.RegisterEvent(
                    ("rare",) if (b * batch + i) % 10_000 == 0 else ("m", str(i % 1000)),
                    common.Timestamp(1_000_000 + b * batch + i, 0) if i % 2 else None,
                    common.EventPayloadJson(b * batch + i),
                )
                for i in range(batch)
            ]
            pending.append(asyncio.ensure_future(server.register(events)))
            if len(pending) == 50 or b == total // batch - 1:
                assert all(await asyncio.gather(*pending))
                pending.clear()
        url = server.urls[0] + "?dialect=HatChatter"
        client = await connect(url, "bench/query", timeout=60)
        middle = await client.query(common.QueryServerParams(1, max_results=1))
        first_id = middle.events[0].id
        mid_id = common.EventId(1, first_id.session + total // batch // 2, 500)
        mid = (
            await client.query(common.QueryTimeseriesParams([("m", "500")], max_results=1))
        ).events[0]
        window_from = common.Timestamp(mid.timestamp.s - 1, 0)
        queries = {
            "latest, 1 type": common.QueryLatestParams([("m", "7")]),
            "latest, 1000 types (m/*)": common.QueryLatestParams([("m", "*")]),
            "timeseries newest 100, all types": common.QueryTimeseriesParams(max_results=100),
            "timeseries newest 100, 1 type": common.QueryTimeseriesParams(
                [("m", "7")], max_results=100
            ),
            "timeseries, rare type (100 of 1M)": common.QueryTimeseriesParams(
                [("rare",)], max_results=100
            ),
            "timeseries 100 in a window, 3 types": common.QueryTimeseriesParams(
                [("m", "1"), ("m", "2"), ("m", "3")],
                t_from=window_from,
                order=common.Order.ASCENDING,
                max_results=100,
            ),
            "timeseries by source ts, 1 type": common.QueryTimeseriesParams(
                [("m", "9")], order_by=common.OrderBy.SOURCE_TIMESTAMP, max_results=100
            ),
            "timeseries page after a mid sentinel": common.QueryTimeseriesParams(
                max_results=100, last_event_id=mid_id
            ),
            "server page from the middle": common.QueryServerParams(
                1, max_results=100, last_event_id=mid_id
            ),
        }
        out = []
        for name, params in queries.items():
            times = []
            for _ in range(20):
                start = time.perf_counter()
                result = await client.query(params)
                times.append(time.perf_counter() - start)
            times.sort()
            out.append((name, times[len(times) // 2] * 1000, len(result.events)))
        await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the work")
    parser.add_argument("--smoke", action="store_true", help="a hundredth of the work (CI)")
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events for the query timings (0: skip)"
    )
    args = parser.parse_args()
    scale = 0.01 if args.smoke else 0.2 if args.quick else 1.0
    if args.smoke:
        args.events = min(args.events, 10_000)
    servers: list[tuple[str, Callable[[Path], tuple[subprocess.Popen[str], int]]]] = [
        ("peerwire full", lambda tmp: start_ours(tmp, "full")),
        ("peerwire normal", lambda tmp: start_ours(tmp, "normal")),
        ("hat-event", start_reference),
    ]
    table: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        for name, start in servers:
            proc, port = start(Path(tmp_name))
            try:
                table[name] = asyncio.run(measure(port, scale))
            finally:
                stop(proc)
    ref = table["hat-event"]
    print(f"eventer benchmark ({os.cpu_count()} cores, loopback, separate processes)")
    print("peerwire full/normal = SQLite synchronous=FULL (default) / NORMAL; x = vs hat-event")
    header = "".join(f"{name:>17}" for name in table)
    print(f"{'':40}{header}")
    for key in ref:
        cells = ""
        for name, figures in table.items():
            ratio = "" if name == "hat-event" else f" {figures[key] / ref[key]:4.1f}x"
            cells += f"{figures[key]:>12,.0f}{ratio:>5}" if ratio else f"{figures[key]:>17,.0f}"
        print(f"{key:40}{cells}")
    if args.events:
        with tempfile.TemporaryDirectory() as tmp_name:
            started = time.perf_counter()
            timings = asyncio.run(million(Path(tmp_name), args.events))
            filled = time.perf_counter() - started
        print(f"\nqueries over {args.events:,} stored events (ours; filled in {filled:.0f} s)")
        for name, ms, count in timings:
            print(f"{name:40}{ms:9.2f} ms  ({count} events)")


if __name__ == "__main__":
    main()

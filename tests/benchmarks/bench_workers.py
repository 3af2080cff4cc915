"""``peerwire serve --workers N``: 1 vs 2 worker processes under the same client load.

    python tests/benchmarks/bench_workers.py [--seconds S] [--clients C] [--loop L]

Not collected by pytest. Each row starts ``peerwire serve`` on this file's registry
(``tcp+gotalk://127.0.0.1:0``) with ``--workers`` 1 or 2, then ``--clients`` client
processes (default 2), each with ``--connections`` connections (default 8) keeping
``--inflight`` requests (default 16) outstanding per connection. All clients count the
requests completed in one shared window of ``--seconds``, which starts 0.5 s after every
client has connected (the driver sends it as ``time.monotonic()`` instants, one clock for
every process of the machine). Ops:

- ``echo``: returns its 16-byte payload: server work per call is the core's alone.
- ``work``: a pure-Python loop of about 0.2 ms per call (measured and printed), so the
  server's CPU, not the clients', limits the rate.

Every row runs ``--rounds`` times (default 3, interleaved, new processes each time) and
prints the median rate, the slowest..fastest round and how many connections each worker
got (from each connection's first call, ``pid``). On a 2-core machine the clients and the
workers share the two cores, so 2 workers cannot reach 2x: read the ratio as what a second
core buys when the clients also need CPU. ``--smoke`` (CI) is ``--seconds 0.2 --rounds 1``
with a 0.05 s warm-up: every row runs, the figures are rough. ``--json PATH`` also writes
the medians as JSON, for ``readme_speed.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
from rpc import loops

ROOT = Path(__file__).resolve().parents[2]

PAYLOAD = b"0123456789abcdef"
WARMUP = 0.5
WORK_ROUNDS = 3000

registry = rpc.Registry()


@registry.handle("pid")
def pid(value: Any) -> int:
    return os.getpid()


@registry.handle("echo")
def echo(data: bytes) -> bytes:
    return data


def busy() -> int:
    total = 0
    for i in range(WORK_ROUNDS):
        total += i * i
    return total


@registry.handle("work")
def work(data: bytes) -> bytes:
    busy()
    return data


# --- a client process ----------------------------------------------------------------------


async def client(url: str, op: str, connections: int, inflight: int) -> tuple[int, list[int]]:
    """Connect, say READY, read the window ("<start> <end>", monotonic) from stdin, load."""
    peers = [await rpc.connect(url) for _ in range(connections)]
    pids = [await peer.request("pid") for peer in peers]
    print("READY", flush=True)
    window = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start, end = map(float, window.split())
    counted = 0

    async def worker(peer: rpc.Peer) -> None:
        nonlocal counted
        while (now := time.monotonic()) < end:
            answer = await peer.request(op, PAYLOAD, raw=True)
            if answer != PAYLOAD:
                raise AssertionError(f"wrong answer {answer!r}")
            if start <= now:
                counted += 1

    await asyncio.gather(*(worker(peer) for peer in peers for _ in range(inflight)))
    await asyncio.gather(*(peer.close() for peer in peers))
    return counted, pids


def run_client(args: argparse.Namespace) -> None:
    counted, pids = loops.run(
        client(args.client, args.op, args.connections, args.inflight), args.loop
    )
    print(json.dumps({"counted": counted, "pids": pids}), flush=True)


# --- the driver ----------------------------------------------------------------------------


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def one_round(args: argparse.Namespace, workers: int, op: str) -> tuple[float, list[int]]:
    serve_cmd = [sys.executable, "-m", "rpc.cli", "serve", __file__, f"--workers={workers}"]
    if args.loop:
        serve_cmd.append(f"--loop={args.loop}")
    server = subprocess.Popen(
        [*serve_cmd, "--listen=tcp+gotalk://127.0.0.1:0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]  # printed once every worker serves
        client_cmd = [
            sys.executable,
            __file__,
            f"--client={url}",
            f"--op={op}",
            f"--connections={args.connections}",
            f"--inflight={args.inflight}",
        ]
        if args.loop:
            client_cmd.append(f"--loop={args.loop}")
        clients = [
            subprocess.Popen(
                client_cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            for _ in range(args.clients)
        ]
        for c in clients:  # every client has connected: the window starts after a warm-up
            assert c.stdout is not None
            if c.stdout.readline().strip() != "READY":
                raise RuntimeError("a client failed to connect")
        start = time.monotonic() + min(WARMUP, args.seconds / 4)  # shorter in smoke runs
        window = f"{start} {start + args.seconds}\n"
        for c in clients:  # all of them before waiting for any
            assert c.stdin is not None
            c.stdin.write(window)
            c.stdin.flush()
        results = [json.loads(c.communicate(timeout=args.seconds + 60)[0]) for c in clients]
        if any(c.returncode for c in clients):
            raise RuntimeError("a client failed")
    finally:
        server.terminate()
        server.wait(30)
    per_worker = collections.Counter(p for r in results for p in r["pids"])
    return sum(r["counted"] for r in results) / args.seconds, sorted(per_worker.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--loop", choices=loops.CHOICES)
    parser.add_argument("--only", choices=("echo", "work"))
    parser.add_argument("--smoke", action="store_true", help="--seconds 0.2 --rounds 1 (CI)")
    parser.add_argument("--json", metavar="PATH", help="also write the medians as JSON")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--op", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args)
        return
    if args.smoke:
        args.seconds, args.rounds = 0.2, 1

    work_us = 1e6 * min(timed(busy) for _ in range(20))
    print(
        f"bench_workers: {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f}), "
        f"Python {sys.version.split()[0]}, "
        f"loop {loops.resolve(args.loop)}; {args.clients} client processes x "
        f"{args.connections} connections x {args.inflight} in flight; "
        f"'work' ~{work_us:.0f} us/call here; {args.rounds} rounds of {args.seconds:g} s"
    )
    ops = [args.only] if args.only else ["echo", "work"]
    rows = [(op, workers) for op in ops for workers in (1, 2)]
    rates: dict[tuple[str, int], list[float]] = {row: [] for row in rows}
    spread: dict[tuple[str, int], list[int]] = {}
    for _ in range(args.rounds):
        for op, workers in rows:
            rate, spread[op, workers] = one_round(args, workers, op)
            rates[op, workers].append(rate)
    print(f"\n{'op':<6} {'workers':>7} {'median':>12} {'rounds':>21} {'conns/worker':>14}")
    for op, workers in rows:
        values = rates[op, workers]
        low, high = min(values), max(values)
        print(
            f"{op:<6} {workers:>7} {statistics.median(values):>10,.0f}/s "
            f"{f'{low:,.0f}..{high:,.0f}':>21} {'/'.join(map(str, spread[op, workers])):>14}"
        )
    for op in ops:
        one, two = (statistics.median(rates[op, w]) for w in (1, 2))
        print(f"{op}: 2 workers = {two / one:.2f}x 1 worker")
    if args.json:
        medians = {op: {str(w): statistics.median(rates[op, w]) for w in (1, 2)} for op in ops}
        figures = {"loop": loops.resolve(args.loop), "cores": os.cpu_count(), "work_us": work_us}
        figures |= {"rounds": args.rounds, "seconds": args.seconds, "rows": medians}
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

"""Group broadcast over 16 node processes on 127.0.0.1: ``python tests/benchmarks/bench_group.py
[--loop asyncio|uvloop] [--quick | --smoke]`` (``--quick``: a fifth of the rounds and
broadcasts; ``--smoke``, for CI: 3 nodes and a hundredth, so every row runs but the figures
are rough).

Not collected by pytest. Every node is its own process (tests/peers/group_node.py) knowing
all the others; one origin broadcasts through the distribution tree (at most 4 direct sends
per node for 16 nodes).

- Latency: one broadcast at a time, the time from the origin starting ``notify`` until the
  last of the 15 other nodes has dispatched it (node processes stamp both with
  ``time.monotonic()``, one clock for the whole machine). Median, 90th percentile, max.
- Throughput: the origin broadcasts N messages back to back (``notify`` applies
  backpressure through the bounded per-peer queues); broadcasts per second is N divided by
  the time until every node has dispatched all N. Nodes only count here (no output per
  message), and the figure is bounded by 16 processes sharing the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.peers.group_node import Cluster

NODES = 16
LATENCY_ROUNDS = 200
THROUGHPUT = {64: 10_000, 4096: 4_000, 65536: 500}  # payload bytes -> broadcasts


async def latency(rounds: int, args: list[str], nodes: int) -> None:
    cluster = await Cluster.start(nodes, seed=1, args=args)
    try:
        origin = cluster.nodes[0]
        receivers = cluster.nodes[1:]
        # warm-up: opens the tree's connections
        for i in range(20):
            await origin.command(cmd="notify", values=[{"warm": i}])
        await cluster.wait_until(lambda: all(len(n.received) == 20 for n in receivers), 10)
        samples = []
        for i in range(rounds):
            want = 21 + i
            sent = await origin.command(cmd="notify", values=[{"i": i}])
            await cluster.wait_until(
                lambda w=want: all(len(n.received) == w for n in receivers), 10
            )
            samples.append(max(n.times[-1] for n in receivers) - sent["t0"])
        samples.sort()
        print(
            f"latency, all {nodes} nodes have a message ({rounds} broadcasts, one "
            f"at a time): median {statistics.median(samples) * 1e3:.2f} ms, "
            f"p90 {samples[int(0.9 * len(samples))] * 1e3:.2f} ms, max {samples[-1] * 1e3:.2f} ms"
        )
    finally:
        await cluster.stop()


async def throughput(size: int, count: int, args: list[str], nodes: int) -> None:
    cluster = await Cluster.start(nodes, seed=1, quiet=True, args=args)
    try:
        origin = cluster.nodes[0]
        value = {"pad": os.urandom(size // 2).hex()}  # incompressible, about `size` bytes
        await origin.command(cmd="notify", values=[value])  # warm-up
        total = 1 + count
        sent = await origin.command(timeout=600, cmd="notify", value=value, count=count)
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            stats = await cluster.stats()
            if all(s["got"] == total for s in stats[1:]):
                break
            if asyncio.get_running_loop().time() > deadline:
                missing = sum(total - s["got"] for s in stats[1:])
                dropped = sum(s["dropped"] for s in stats)
                print(
                    f"throughput, {size}-byte values: {missing} deliveries missing after 120 s "
                    f"({dropped} frames dropped)"
                )
                return
            await asyncio.sleep(0.05)  # polling the counters
        elapsed = max(s["last_t"] for s in stats[1:]) - sent["t0"]
        frames = sum(s["frames_sent"] for s in stats)
        print(
            f"throughput, {size:>6}-byte values: {count / elapsed:8.0f} broadcasts/s "
            f"({count} in {elapsed:.2f} s; {frames / total:.1f} frames per broadcast; "
            f"origin's notify loop {count / (sent['t1'] - sent['t0']):.0f}/s)"
        )
    finally:
        await cluster.stop()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="3 nodes, 1/100 of the work (CI)")
    opts = parser.parse_args()
    scale = 100 if opts.smoke else 5 if opts.quick else 1
    nodes = 3 if opts.smoke else NODES
    args = ["--loop", opts.loop]
    python = sys.version.split()[0]
    print(
        f"{nodes} node processes on 127.0.0.1 ({opts.loop}), {os.cpu_count()} CPUs, "
        f"Python {python}, load average {os.getloadavg()[0]:.1f}"
    )
    await latency(max(1, LATENCY_ROUNDS // scale), args, nodes)
    for size, count in THROUGHPUT.items():
        await throughput(size, max(1, count // scale), args, nodes)


if __name__ == "__main__":
    asyncio.run(main())

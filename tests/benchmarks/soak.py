"""Soak: hostile and normal load together, ``python tests/benchmarks/soak.py [--minutes N]``.

Not collected by pytest. Processes on 127.0.0.1:

- the **server** (``--serve``, a child): ``tcp+gotalk``, ``tcp+sbs``, ``ssl+gotalk`` and
  ``ws+gotalk`` servers with their defaults (``handshake_timeout`` 10 s, Gotalk read
  timeout 30 s); it answers ``stats`` on stdin with its connection counts, its number of
  gc-tracked objects and its longest garbage collection since the last ``stats``;
- a **control** server, the same but never attacked;
- two **canaries** (``--canary URL``, children): one ``tcp+gotalk`` client per server,
  sending one echo request every 10 ms and printing each second's latencies. The control
  canary measures what the machine alone does to latency (it is shared, and busy);
- this process: the attackers and the well-behaved clients. Once the servers and canaries
  run, it lowers its own priority (``--attacker-nice``, default 10; 0 keeps it): attackers
  on other hosts would not take the server's CPU, here they share its 2 CPUs. The control
  canary shows what the sharing still costs. ``--pin`` goes further: this process runs on
  CPU 0 only and the servers and canaries on the other CPUs, as if the attackers were on
  another host (their traffic still arrives; the kernel's loopback work stays shared).

First the canaries run alone for ``--idle`` s (the idle p50/p99); then, for ``--minutes``
(default 10), these run together and one line per ``--every`` s (default 30) shows the
server's RSS and CPU (user + system, % of one core, from /proc), the canary's p50/p99 over
that period, the control canary's p99, the load average, the server's connections, its
gc-tracked objects and longest collection (ms):

- slowloris on each transport: 40 connections each that trickle one byte every 2 s of a
  Gotalk version, a Chatter frame, a TLS ClientHello or a WebSocket HTTP head (the
  handshake limit closes them; they reconnect);
- silent TLS handshakes: 200 TCP connections to the TLS port that never send a byte;
- non-readers: 4 Gotalk connections that ask for 64 x 256 KiB results and never read
  (each is dropped after 40 s and replaced);
- garbage: 10 connections per second per protocol sending a valid handshake, then 256
  random bytes;
- floods of refused requests: on each protocol, 100 requests for an unknown operation
  at once every 100 ms, on one connection;
- normal load: one client per transport sending an echo request every 5 ms.

``--attack GROUP`` (repeatable: ``slowloris``, ``silent-tls``, ``non-reader``, ``garbage``,
``refused``, ``normal``) runs only those groups. ``--smoke`` runs everything for a few
seconds (idle 2 s, load 6 s, a line per 2 s).
``--tracemalloc`` traces the server's allocations (slowing it down several times) and
prints its top growth between the end of the first period and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
from rpc import loops
from rpc.workers import freeze_startup_objects
from tests.benchmarks.soak_attackers import GROUPS, HOST, Counters, attacks, paced
from tests.certs import make_pki
from transports.stream import server_ssl_context

TICK = os.sysconf("SC_CLK_TCK")
CANARY_PERIOD = 0.01


# --- the server (child) ---------------------------------------------------------------------


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(data: bytes) -> bytes:
        return data

    @reg.handle("big")
    def big(size: int) -> bytes:
        return b"x" * size

    return reg


async def serve(pki_dir: str, tls_max_connections: int, chatter_ping: float | None) -> None:
    """Serve every transport and answer ``stats`` lines on stdin until stdin closes."""
    pki = make_pki(Path(pki_dir))
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    reg = registry()
    servers = {
        "tcp+gotalk": rpc.serve(f"tcp+gotalk://{HOST}:0", registry=reg),
        "tcp+sbs": rpc.serve(f"tcp+sbs://{HOST}:0", registry=reg, ping_interval=chatter_ping),
        "ssl+gotalk": rpc.serve(
            f"ssl+gotalk://{HOST}:0", registry=reg, ssl=ctx, max_connections=tls_max_connections
        ),
        "ws+gotalk": rpc.serve(f"ws+gotalk://{HOST}:0/gotalk/", registry=reg),
    }
    started = {name: await srv.start() for name, srv in servers.items()}
    freeze_startup_objects()  # as `peerwire serve` does
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    urls = {name: str(srv.url) for name, srv in started.items()}
    print("URLS " + json.dumps(urls), flush=True)
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    snapshot = None
    while line := await stdin.readline():
        if line.strip() == b"growth":  # the first call takes the baseline
            now = tracemalloc.take_snapshot()
            top = now.compare_to(snapshot, "lineno")[:10] if snapshot else []
            snapshot = snapshot or now
            print("GROWTH " + json.dumps([str(stat) for stat in top]), flush=True)
        if line.strip() == b"stats":
            stats: dict[str, Any] = {
                name: {"peers": len(srv.peers), "refused": srv.refused}
                for name, srv in started.items()
            }
            stats["gc"] = {"objects": len(gc.get_objects()), "worst_ms": pauses.take()}
            print("STATS " + json.dumps(stats), flush=True)
    for srv in started.values():
        await srv.close(drain_timeout=0)


class GcPauses:
    """A ``gc.callbacks`` entry: the longest collection (ms) since the last ``take``."""

    def __init__(self) -> None:
        self.started = 0.0
        self.worst = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.worst = max(self.worst, (time.perf_counter() - self.started) * 1000)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return round(worst, 2)


class ServerChild:
    """The server process: its URLs, its /proc figures and its connection counts."""

    def __init__(self, proc: asyncio.subprocess.Process, urls: dict[str, str], folder: Path):
        self.proc, self.urls, self.folder = proc, urls, folder

    @classmethod
    async def start(cls, *extra: str, pki_dir: str) -> ServerChild:
        """Start the server; its log goes to ``PKI_DIR/server.log``."""
        with open(Path(pki_dir) / "server.log", "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--serve",
                pki_dir,
                *extra,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
            )
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line.startswith(b"URLS "):
            raise RuntimeError(f"server child said {line!r}")
        return cls(proc, json.loads(line[5:]), Path(pki_dir))

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def log_lines(self) -> int:
        return len((self.folder / "server.log").read_bytes().splitlines())

    def port(self, name: str) -> int:
        return rpc.parse_url(self.urls[name]).port

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    async def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"stats\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        return json.loads(line[6:])

    async def growth(self) -> list[str]:
        """The server's top memory growth since the first call (``--tracemalloc``)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"growth\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        return json.loads(line[7:])

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


# --- the canary (child) ---------------------------------------------------------------------


async def canary(url: str) -> None:
    """One echo every 10 ms on one connection; a line of latencies (ms) per second."""
    async with rpc.connect(url, registry=rpc.Registry()) as peer:
        batch: list[float] = []
        flushed = time.monotonic()
        while True:
            t0 = time.perf_counter()
            await peer.request("echo", b"canary", raw=True, timeout=10)
            batch.append((time.perf_counter() - t0) * 1000)
            now = time.monotonic()
            if now - flushed >= 1.0:
                print("LAT " + json.dumps([round(x, 3) for x in batch]), flush=True)
                batch, flushed = [], now
            await asyncio.sleep(max(0.0, CANARY_PERIOD - (time.perf_counter() - t0)))


class CanaryChild:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.latencies: list[float] = []
        self.reporting = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, url: str) -> CanaryChild:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--canary", url, stdout=asyncio.subprocess.PIPE
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            if line.startswith(b"LAT "):
                self.latencies += json.loads(line[4:])
                self.reporting.set()

    def take(self) -> list[float]:
        taken, self.latencies = self.latencies, []
        return taken

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        await self.proc.wait()
        self._reader.cancel()


def percentiles(samples: list[float]) -> tuple[float, float]:
    if len(samples) < 2:
        return (samples[0], samples[0]) if samples else (float("nan"), float("nan"))
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49], cuts[98]


def raise_nofile(want: int) -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = min(max(soft, want), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


def machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs ({model}), Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


async def soak(
    minutes: float,
    idle: float,
    every: float,
    trace: bool,
    groups: Sequence[str] = GROUPS,
    nice: int = 10,
    pin: bool = False,
) -> None:
    """See the module doc; ``trace`` prints the server's top memory growth at the end."""
    raise_nofile(8192)
    print(machine())
    with tempfile.TemporaryDirectory() as pki_dir, tempfile.TemporaryDirectory() as ctl_dir:
        extra = ("--tls-max-connections", "400") + (("--tracemalloc",) if trace else ())
        srv = await ServerChild.start(*extra, pki_dir=pki_dir)
        control = await ServerChild.start(pki_dir=ctl_dir)
        bird = await CanaryChild.start(srv.urls["tcp+gotalk"])
        ctl_bird = await CanaryChild.start(control.urls["tcp+gotalk"])
        try:
            if pin:  # the attackers on CPU 0, everyone measured on the others (idle too)
                others = set(range(1, os.cpu_count() or 2))
                for proc in (srv.proc, control.proc, bird.proc, ctl_bird.proc):
                    os.sched_setaffinity(proc.pid, others)
                os.sched_setaffinity(0, {0})
            for child in (bird, ctl_bird):
                await asyncio.wait_for(child.reporting.wait(), 60)
                child.take()  # its first second: start-up
            await asyncio.sleep(idle)  # the measuring window of the idle canary
            idle_lat = bird.take()
            p50, p99 = percentiles(idle_lat)
            _, c99 = percentiles(ctl_bird.take())
            print(
                f"idle canary: {len(idle_lat)} requests, p50 {p50:.2f} ms, p99 {p99:.2f} ms "
                f"(control p99 {c99:.2f} ms); server RSS {srv.rss_mb():.1f} MB; load {load()}"
            )
            os.nice(nice)  # the children keep their priority
            count = Counters()
            tasks = await paced(attacks(srv, count, groups), spread=min(5.0, idle))
            print(
                f"{'t (s)':>6} {'RSS MB':>7} {'CPU %':>6} {'p50 ms':>7} {'p99 ms':>7}"
                f" {'x idle':>6} {'ctl p99':>7} {'load':>5} {'conns':>6} {'objects':>8}"
                f" {'gc ms':>6}  events"
            )
            started = last = time.monotonic()
            cpu_last = srv.cpu_seconds()
            bird.take()
            ctl_bird.take()
            every_p99: list[tuple[float, float]] = []
            while (now := time.monotonic()) - started < minutes * 60:
                await asyncio.sleep(min(every, started + minutes * 60 - now))
                now, cpu = time.monotonic(), srv.cpu_seconds()
                q50, q99 = percentiles(bird.take())
                _, k99 = percentiles(ctl_bird.take())
                every_p99.append((q99, k99))
                stats = await srv.stats()
                collector = stats.pop("gc")
                conns = sum(s["peers"] for s in stats.values())
                events = ", ".join(f"{k} {v}" for k, v in sorted(count.items()))
                count.clear()
                print(
                    f"{now - started:6.0f} {srv.rss_mb():7.1f} "
                    f"{100 * (cpu - cpu_last) / (now - last):6.1f} {q50:7.2f} {q99:7.2f} "
                    f"{q99 / p99:6.1f} {k99:7.2f} {load():>5} {conns:6d} "
                    f"{collector['objects']:8d} {collector['worst_ms']:6.1f}  {events}",
                    flush=True,
                )
                last, cpu_last = now, cpu
                if trace and len(every_p99) == 1:
                    await srv.growth()  # the baseline, after the attackers' first period
            q99s = sorted(q for q, _ in every_p99)
            k99s = sorted(k for _, k in every_p99)
            print(
                f"canary p99 per period: median {statistics.median(q99s):.2f} ms, worst "
                f"{q99s[-1]:.2f} ms = {statistics.median(q99s) / p99:.1f}x / "
                f"{q99s[-1] / p99:.1f}x the idle p99; control (no attack) median "
                f"{statistics.median(k99s):.2f} ms, worst {k99s[-1]:.2f} ms"
            )
            print(f"server log: {srv.log_lines()} lines (WARNINGs for the attackers)")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if trace:
                print("\n".join(await srv.growth()))
        finally:
            for child in (bird, ctl_bird):
                await child.stop()
            for server in (srv, control):
                await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=30.0, help="idle canary window (s)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds per line")
    parser.add_argument("--smoke", action="store_true", help="a few seconds of everything")
    parser.add_argument("--serve", metavar="PKI_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--tls-max-connections", type=int, default=10_000, help=argparse.SUPPRESS)
    parser.add_argument("--chatter-ping", type=float, default=30.0, help=argparse.SUPPRESS)
    parser.add_argument("--canary", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument(
        "--attack", action="append", choices=GROUPS, help="only these groups (repeat it)"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="print the server's top memory growth"
    )
    parser.add_argument(
        "--attacker-nice", type=int, default=10, help="niceness of the attackers (see above)"
    )
    parser.add_argument(
        "--pin", action="store_true", help="attackers on CPU 0, servers and canaries elsewhere"
    )
    args = parser.parse_args()
    if args.serve:
        raise_nofile(65536)
        if args.tracemalloc:
            tracemalloc.start(8)
        loops.run(serve(args.serve, args.tls_max_connections, args.chatter_ping))
    elif args.canary:
        loops.run(canary(args.canary))
    elif args.smoke:
        loops.run(soak(minutes=0.1, idle=2.0, every=2.0, trace=args.tracemalloc))
    else:
        groups = args.attack or GROUPS
        loops.run(
            soak(
                args.minutes,
                args.idle,
                args.every,
                args.tracemalloc,
                groups,
                args.attacker_nice,
                args.pin,
            )
        )


if __name__ == "__main__":
    main()

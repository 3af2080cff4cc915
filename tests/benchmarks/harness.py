"""The two-process harness of ``bench_rpc.py`` and ``bench_websocket.py``.

Not collected by pytest. A benchmark script is the client; each row's server is the same
script run with ``--serve NAME`` in a process of its own (:class:`ServerProcess`), which
prints ``PORT <n>``, answers every line on its stdin with ``CPU <process seconds>`` and
serves until its stdin closes (:func:`serve_until_stdin_closes`). :func:`measure` runs one
timed window of workers against it and returns a :class:`Sample`.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAYLOAD = b"0123456789abcdef"
"""What every worker sends and expects back."""
WARMUP = 0.5
"""Seconds of work before a window is timed (a quarter of the window when that is less)."""
STOP_TIMEOUT = 10.0
"""Seconds the workers get to finish their last requests after a window."""

Call = Callable[[], Awaitable[bytes]]
Close = Callable[[], Awaitable[None]]


class Profile:
    """One side's profiler: ``start`` and ``stop`` once; ``stop`` writes the report."""

    def __init__(self, kind: str, directory: str, name: str, side: str) -> None:
        self.path = Path(directory) / f"{name}-{side}"
        if kind == "pyinstrument":
            from pyinstrument import Profiler

            self.profiler: Any = Profiler(interval=0.0002, async_mode="disabled")
        else:
            self.profiler = cProfile.Profile()

    def start(self) -> None:
        if isinstance(self.profiler, cProfile.Profile):
            self.profiler.enable()
        else:
            self.profiler.start()

    def stop(self) -> None:
        if isinstance(self.profiler, cProfile.Profile):
            self.profiler.disable()
            self.profiler.dump_stats(str(self.path.with_suffix(".prof")))
        else:
            self.profiler.stop()
            text = self.profiler.output_text(unicode=False, color=False, show_all=False)
            self.path.with_suffix(".txt").write_text(text)


async def serve_until_stdin_closes(port: int, close: Close, profile: Profile | None = None) -> None:
    """The server process's side: announce ``port``, answer each ``cpu`` line on stdin with
    ``CPU <seconds>``, then ``close()`` once stdin closes. With a profile, the first ``cpu``
    line starts it and the second stops it."""
    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.create_future()
    fd = sys.stdin.fileno()
    profile_state = 0  # 0 not started, 1 running, 2 written

    def on_stdin() -> None:
        data = os.read(fd, 4096)
        nonlocal profile_state
        for _ in range(data.count(b"\n")):
            print(f"CPU {time.process_time()!r}", flush=True)
            if profile is not None and profile_state < 2:
                (profile.stop if profile_state else profile.start)()
                profile_state += 1
        if not data and not stdin_closed.done():
            stdin_closed.set_result(None)

    loop.add_reader(fd, on_stdin)
    await stdin_closed
    loop.remove_reader(fd)
    await close()


@dataclass(slots=True)
class Sample:
    """One timed window: completed requests/s and CPU microseconds per request per side."""

    rate: float
    client_us: float
    server_us: float


class ServerProcess:
    """Row ``name``'s server: ``script`` with ``--serve``, in a process of its own; it
    prints ``PORT n`` and answers ``cpu`` on stdin."""

    def __init__(
        self,
        name: str,
        script: str,
        cpu: int | None = None,
        profile: tuple[str, str] | None = None,
    ) -> None:
        command = [sys.executable, script, "--serve", name]
        if cpu is not None:
            command += ["--cpu", str(cpu)]
        if profile:
            command += ["--profiler", profile[0], "--profile", profile[1]]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self._line()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"{name} server did not start (said {line!r})")
        self.port = int(line.split()[1])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def cpu_time(self) -> float:
        """The server's process CPU seconds so far (blocks for one exchange on its pipes)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("cpu\n")
        self.proc.stdin.flush()
        return float(self._line().split()[1])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def measure(
    call: Call,
    inflight: int,
    seconds: float,
    server: ServerProcess,
    profile: Profile | None = None,
) -> Sample:
    """Completed requests per second with ``inflight`` workers, after a warm-up (WARMUP, or a
    quarter of ``seconds`` when that is shorter: smoke runs)."""
    count = 0
    running = True

    async def worker() -> None:
        nonlocal count
        while running:
            reply = await call()
            if reply != PAYLOAD:
                raise AssertionError(f"echo returned {reply!r}")
            count += 1

    tasks = [asyncio.create_task(worker()) for _ in range(inflight)]
    await asyncio.sleep(min(WARMUP, seconds / 4))
    server_start = server.cpu_time()
    if profile is not None:
        profile.start()
    start_count, start, cpu_start = count, time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    done = count - start_count
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if profile is not None:
        profile.stop()
    server_cpu = server.cpu_time() - server_start
    running = False
    try:  # a side that stopped answering fails the row instead of hanging the script
        async with asyncio.timeout(STOP_TIMEOUT):
            await asyncio.gather(*tasks)
    except TimeoutError:
        for task in tasks:
            task.cancel()
        raise RuntimeError(f"requests unanswered {STOP_TIMEOUT} s after the window") from None
    if done == 0:
        raise RuntimeError(f"no request completed in {seconds} s")
    return Sample(done / elapsed, cpu / done * 1e6, server_cpu / done * 1e6)

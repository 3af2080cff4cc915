"""Every benchmark's smoke pass (CI's ``make bench-smoke``):
``python tests/benchmarks/smoke.py [--jobs N]``.

Runs each ``bench_*.py``, ``soak.py`` and ``readme_speed.py`` (which prints the README's
speed section, not writing it) with ``--smoke``, and ``bench_core.py`` and
``bench_rpc.py`` again with ``--loop uvloop``, ``--jobs`` at a time (default: a job per
core), each in a process of its own. A smoke pass is there so that the benchmarks cannot
rot: every row runs next to its baseline, nothing about speed is asserted, and the figures
of scripts that ran side by side are rougher still. Each script's output is printed whole,
in the order above, with its exit status and seconds; the exit status is 1 when any script
failed (all of them run regardless)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMEOUT = 900.0
"""Seconds a script may take (the slowest, bench_compiled.py's build and runs, takes about
a minute on 2 cores)."""


def commands() -> list[list[str]]:
    scripts = [*sorted(HERE.glob("bench_*.py")), HERE / "soak.py", HERE / "readme_speed.py"]
    runs = [[str(script.relative_to(ROOT)), "--smoke"] for script in scripts]
    for name in ("bench_core.py", "bench_rpc.py"):
        runs.append([str((HERE / name).relative_to(ROOT)), "--smoke", "--loop", "uvloop"])
    return runs


def run(command: list[str]) -> tuple[int, str, float]:
    """Exit status, output (stdout and stderr as they came) and seconds of one script. A
    script past :data:`TIMEOUT` is killed with every process it started (its servers,
    nodes, a JVM): each runs in a session of its own."""
    started = time.monotonic()
    with subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            output += f"\n(killed after {TIMEOUT:.0f} s, with what it started)\n"
    return proc.returncode, output, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="scripts at once")
    args = parser.parse_args()
    runs = commands()
    started = time.monotonic()
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for command, (status, output, seconds) in zip(runs, pool.map(run, runs), strict=True):
            line = " ".join(command)
            print(f"== {line}", flush=True)
            print(output, end="" if output.endswith("\n") else "\n")
            print(f"== {line}: exit {status}, {seconds:.0f} s", flush=True)
            if status != 0:
                failed.append(line)
    print(f"== {len(runs)} smoke passes in {time.monotonic() - started:.0f} s", end="")
    print(f"; failed: {', '.join(failed)}" if failed else "", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The compiled codecs against the sources, in one run:
``python tests/benchmarks/bench_compiled.py [--rounds N] [--loop uvloop] [--smoke]``.

Not collected by pytest. The tree is copied twice (:mod:`tests.packaging`): ``pure`` runs
the sources; ``compiled`` has the extension modules of a wheel built as users build it
(``PEERWIRE_COMPILE=1``, see setup.py; about 15 s on 2 cores) next to them. Each round runs
every script in both copies, the order alternating, each copy's scripts with the copy first
on ``sys.path``:

- ``bench_core.py``: the core's CPU per request without sockets, server and client rows (the
  steadiest figures; best of the rounds);
- ``bench_rpc.py --rounds 1``: ``peerwire-gotalk``, ``peerwire-chatter`` and ``bare-echo``
  over real sockets (rate, client and server CPU per request; medians of the rounds);
- ``bench_gotalk.py`` and ``bench_chatter.py``: microseconds per codec call (best of the
  rounds).

The table gives each figure for both copies and the compiled one's change. ``--rounds``
(default 3); ``--loop uvloop`` runs bench_core and bench_rpc on uvloop; ``--smoke`` (CI) is
one round of each script's own ``--smoke``: every row runs, the figures are rough, and the
wheel tests/test_compiled_build.py built for these sources is used when there is one
(``tests.packaging.kept_compiled``), else it is built.
Nothing about speed is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.packaging import build_wheel, copy_tree, env_for, kept_compiled, overlay
from wire import COMPILABLE

RPC_ROWS = ("bare-echo", "peerwire-gotalk", "peerwire-chatter")
_CORE = re.compile(r"^(gotalk|chatter)\s+(\S.*?)\s+([\d.]+) us(?:\s|$)")
_ROUND = re.compile(r"^round \d+\s+(\S+)\s+(.*)$")
_MODE = re.compile(r"(\w+) ([\d,]+)/s \(([\d.]+)\+([\d.]+) us\)")
_CODEC = re.compile(r"^(gotalk|chatter)\s+(.*?)\s+([\d.]+) us/op")


class Copy:
    """One copy of the tree and the figures its scripts printed, by label."""

    def __init__(self, name: str, tree: Path) -> None:
        self.name = name
        self.tree = tree
        self.samples: dict[str, list[float]] = defaultdict(list)

    def python(self, *args: str) -> str:
        """Run ``python args`` in the copy; its stdout (stderr passes through)."""
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.tree,
            env=env_for(self.tree),
            stdout=subprocess.PIPE,
            text=True,
        )
        if done.returncode:
            raise SystemExit(f"{self.name}: {' '.join(args)} exited with {done.returncode}")
        return done.stdout

    def run(self, script: str, *args: str) -> str:
        return self.python(str(self.tree / "tests" / "benchmarks" / script), *args)

    def round(self, smoke: bool, loop: str) -> None:
        quick = ["--smoke"] if smoke else []
        for line in self.run("bench_core.py", *quick, "--loop", loop).splitlines():
            if match := _CORE.match(line):
                self.samples[f"core  {match[1]} {match[2]}"].append(float(match[3]))
        rows = [arg for row in RPC_ROWS for arg in ("--only", row)]
        rpc = self.run("bench_rpc.py", *quick, "--rounds", "1", "--loop", loop, *rows)
        for line in rpc.splitlines():
            if match := _ROUND.match(line):
                for mode, rate, client, server in _MODE.findall(match[2]):
                    label = f"rpc   {match[1]} {mode}"
                    self.samples[f"{label} rate/s"].append(float(rate.replace(",", "")))
                    self.samples[f"{label} client"].append(float(client))
                    self.samples[f"{label} server"].append(float(server))
        for script in ("bench_gotalk.py", "bench_chatter.py"):
            for line in self.run(script, *quick).splitlines():
                if (match := _CODEC.match(line)) and "hat-sbs" not in match[2]:
                    label = " ".join(f"codec {match[1]} {match[2]}".split())
                    self.samples[label].append(float(match[3]))


def summary(label: str, values: list[float]) -> float:
    """Rates and bench_rpc's CPU: the median; times without sockets: the best (other
    processes only ever add time to those)."""
    if label.startswith("rpc"):
        return statistics.median(values)
    return min(values)


def report(pure: Copy, compiled: Copy, rounds: int) -> None:
    families = {label.split()[0] for label in pure.samples}
    if families != {"core", "rpc", "codec"}:  # a script's output no longer parses
        raise SystemExit(f"figures parsed from {sorted(families)} only")
    if pure.samples.keys() != compiled.samples.keys():
        raise SystemExit(f"rows differ: {sorted(pure.samples.keys() ^ compiled.samples.keys())}")
    print(f"\n{rounds} round(s); us per request or call unless marked (rate/s)")
    print(f"{'figure':<48}{'pure':>12}{'compiled':>12}{'change':>9}")
    for label, values in pure.samples.items():
        base = summary(label, values)
        value = summary(label, compiled.samples[label])
        change = f"{(value - base) / base * 100:+.0f}%" if base else "n/a"
        places = 0 if label.endswith("rate/s") else 2
        print(f"{label:<48}{base:>12,.{places}f}{value:>12,.{places}f}{change:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per copy (default 3)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--smoke", action="store_true", help="one quick round (CI)")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    with tempfile.TemporaryDirectory(prefix="peerwire-compiled-") as parent:
        pure = Copy("pure", copy_tree(Path(parent) / "pure"))
        compiled = Copy("compiled", copy_tree(Path(parent) / "compiled"))
        start = time.perf_counter()
        wheel = kept_compiled() if args.smoke else None
        if wheel is not None:
            print(f"== compiled build: the one the tests built ({wheel.name})", flush=True)
        else:
            wheel = build_wheel(compiled.tree, Path(parent) / "wheel", compiled=True)
            took = time.perf_counter() - start
            print(f"== compiled build: {took:.0f} s ({wheel.name})", flush=True)
        overlay(wheel, compiled.tree)
        for copy, expected in ((pure, 0), (compiled, len(COMPILABLE))):
            count = copy.python("-c", "import wire; print(len(wire.compiled()))")
            if int(count) != expected:
                raise SystemExit(f"{copy.name}: {count.strip()} modules compiled, not {expected}")
        for number in range(rounds):
            order = (pure, compiled) if number % 2 == 0 else (compiled, pure)
            for copy in order:
                print(f"== round {number + 1}: {copy.name}", flush=True)
                copy.round(args.smoke, args.loop)
        report(pure, compiled, rounds)


if __name__ == "__main__":
    main()

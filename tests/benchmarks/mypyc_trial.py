"""Compiled codec trial: ``python tests/benchmarks/mypyc_trial.py [--rounds N] [--tests]``.

Not collected by pytest. Asks whether compiling the hot path with mypyc pays: it copies the
checkout (working tree, without ``.git``, venvs and caches) into a temporary folder once per
variant, compiles the variant's modules there with mypyc (``.so`` files next to the copies'
sources, which shadow the ``.py``; the checkout itself never gets one), and measures every
variant in the same run:

- ``pure``: the copy as it is, interpreted (the baseline);
- ``wire``: the codecs compiled (:data:`WIRE_MODULES`: Gotalk framing, decoding and
  encoding; Chatter connection, conversations, envelope and framing; ``wire/sbs.py``);
- ``wire+rpc``: the codecs and the core's per-request modules (:data:`RPC_MODULES`: peer,
  outbox, deadlines, task set, both adapters). ``rpc/calls.py`` and ``rpc/responder.py``
  stay interpreted: mypyc rejects them (async generators, an ``if TYPE_CHECKING:`` block in
  a class body). mypyc turns class attributes into instance slots, so the adapters'
  ``default_timeout`` (read from the class by :mod:`rpc.api`) is declared ``ClassVar`` in
  this variant's copy first (:data:`CLASSVAR_PATCHES`; no change to what the code does).

``wire/gotalk/messages.py`` stays interpreted in every variant: compiled, its frozen
dataclasses fail at import (the ``TYPE`` ClassVar with a default is taken for a field
before the others), and the decoder builds them with ``object.__new__`` and slot setters,
which native classes do not have.

Measurements, each variant's copy running its own scripts (``PYTHONPATH`` set to the copy):

- ``tests/benchmarks/bench_rpc.py --rounds 1`` for the rows of ``--only`` (default
  ``peerwire-gotalk`` and ``peerwire-chatter``), ``--rounds`` times with the variants
  interleaved (their order rotated each round); the table shows the median rate and the
  median client and server CPU microseconds per request, per mode (``sequential``,
  ``inflight100``), each compiled variant's server CPU against ``pure``'s, and the range of
  the server CPU over the rounds;
- ``bench_gotalk.py`` and ``bench_chatter.py`` in the same rounds: microseconds per codec
  call, the best of all rounds (other processes only ever add time).

``--tests`` then runs the Gotalk, Chatter and RPC core tests (``tests/test_gotalk_*.py``,
``tests/test_chatter_*.py``, ``tests/test_rpc_*.py``) in the last variant's copy and prints
the failed tests and pytest's summary line. ``--variants`` picks the compiled variants
(``pure`` is always measured); ``--no-codec`` skips the codec benchmarks.

mypyc comes with mypy (in the ``test`` extra); building needs setuptools (``pip install
setuptools`` where the venv has none) and a C compiler. Compiling takes about 15 s
(``wire``) and 35 s (``wire+rpc``) on a 2-core machine and the default run with ``--tests``
about 6 minutes, so there is no smoke mode. Rates drift between runs on small machines:
compare the CPU columns, and variants measured in the same run only.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WIRE_MODULES = (
    "wire/gotalk/connection.py",
    "wire/gotalk/decoding.py",
    "wire/gotalk/encoding.py",
    "wire/chatter/connection.py",
    "wire/chatter/conversations.py",
    "wire/chatter/envelope.py",
    "wire/chatter/framing.py",
    "wire/sbs.py",
)
RPC_MODULES = (
    "rpc/peer.py",
    "rpc/outbox.py",
    "rpc/deadlines.py",
    "rpc/tasks.py",
    "rpc/gotalk_peer.py",
    "rpc/chatter_peer.py",
)
VARIANTS: dict[str, tuple[str, ...]] = {
    "pure": (),
    "wire": WIRE_MODULES,
    "wire+rpc": WIRE_MODULES + RPC_MODULES,
}
CLASSVAR_PATCHES = (
    ("rpc/options.py", "    default_timeout: float\n"),
    ("rpc/gotalk_peer.py", "    default_timeout = 30.0\n"),
    ("rpc/chatter_peer.py", "    default_timeout = 5.0"),
)
"""(file, line start) of each ``default_timeout`` class attribute that becomes ``ClassVar``."""
ROWS = ("peerwire-gotalk", "peerwire-chatter")
MODES = ("sequential", "inflight100")
TESTS = ("tests/test_gotalk_*.py", "tests/test_chatter_*.py", "tests/test_rpc_*.py")
IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "*.so", "build", "site", "*.egg-info", ".*_cache"
)

# setuptools' setup() reads pyproject.toml in its working folder, so the build runs in a
# folder of its own and writes the extensions into the copy with --build-lib.
BUILD = """
import sys
from mypyc.build import mypycify
from setuptools import setup

root, modules = sys.argv[1], sys.argv[2:]
paths = [f"{root}/{module}" for module in modules]
setup(
    name="peerwire-mypyc-trial",
    ext_modules=mypycify([*paths, "--config-file", f"{root}/pyproject.toml"], opt_level="3"),
    script_args=["build_ext", "--build-lib", root, "--build-temp", "objects", "--quiet"],
)
"""

_ROUND = re.compile(r"^round \d+\s+(\S+)\s+(.*)$")
_MODE = re.compile(r"(\w+) ([\d,]+)/s \(([\d.]+)\+([\d.]+) us\)")
_CODEC = re.compile(r"^(gotalk|chatter)\s+(.*?)\s+([\d.]+) us/op")


@dataclass(slots=True)
class Variant:
    name: str
    modules: tuple[str, ...]
    copy: Path
    build_seconds: float = 0.0
    # (row, mode) -> [(rate, client us, server us) per round]
    rpc: dict[tuple[str, str], list[tuple[float, float, float]]] = field(default_factory=dict)
    codec: dict[str, float] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(self.copy))
        legacy = ROOT / ".venv-legacy" / "bin" / "python"
        if legacy.exists():  # tests/test_chatter_interop.py looks for it next to the tests
            env.setdefault("PEERWIRE_LEGACY_PYTHON", str(legacy))
        return env

    def run(self, *args: str, timeout: float = 600) -> str:
        """Run ``python args`` in the copy; return its stdout (stderr passes through)."""
        done = subprocess.run(
            [sys.executable, *args],
            cwd=self.copy,
            env=self.env(),
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout,
        )
        if done.returncode:
            raise SystemExit(f"{self.name}: {' '.join(args)} exited with {done.returncode}")
        return done.stdout


def _classvar(copy: Path) -> None:
    """Declare the adapters' ``default_timeout`` ``ClassVar`` (mypyc keeps ClassVars on the
    class; other class attributes become per-instance defaults)."""
    for name, start in CLASSVAR_PATCHES:
        path = copy / name
        text = path.read_text()
        if "default_timeout: ClassVar[float]" in text:
            continue  # the checkout has it already
        if start not in text:
            raise SystemExit(f"{name}: no line starting {start!r} to declare ClassVar")
        if "default_timeout =" in start:
            patched = start.replace("default_timeout =", "default_timeout: ClassVar[float] =")
        else:
            patched = start.replace(": float", ": ClassVar[float]")
        text = text.replace(start, patched, 1)
        text = re.sub(
            r"^from typing import ", "from typing import ClassVar, ", text, count=1, flags=re.M
        )
        path.write_text(text)


def prepare(name: str, modules: tuple[str, ...], parent: Path) -> Variant:
    """Copy the checkout for variant ``name`` and compile its modules there."""
    copy = parent / name.replace("+", "-")
    shutil.copytree(ROOT, copy, ignore=IGNORE)
    variant = Variant(name, modules, copy)
    if not modules:
        return variant
    if any(module.startswith("rpc/") for module in modules):
        _classvar(copy)
    build = parent / f"build-{copy.name}"
    build.mkdir()
    print(f"== compiling {len(modules)} modules for {name!r} with mypyc", flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(copy), *modules],
        cwd=build,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    variant.build_seconds = time.perf_counter() - start
    if done.returncode:
        sys.stdout.write(done.stdout)
        raise SystemExit(f"mypyc failed for {name!r}")
    names = [module.removesuffix(".py").replace("/", ".") for module in modules]
    check = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(name, importlib.import_module(name).__file__)\n"
    )
    for line in variant.run("-c", check, *names).splitlines():
        module, path = line.split()
        if not path.endswith(".so"):
            raise SystemExit(f"{name}: {module} imports from {path}, not the compiled module")
    return variant


def bench_rpc(variant: Variant, rows: tuple[str, ...], seconds: float) -> None:
    """One round of bench_rpc's rows in ``variant``'s copy."""
    args = ["tests/benchmarks/bench_rpc.py", "--rounds", "1", "--seconds", str(seconds)]
    for row in rows:
        args += ["--only", row]
    for line in variant.run(*args).splitlines():
        match = _ROUND.match(line)
        if match is None:
            continue
        for mode, rate, client, server in _MODE.findall(match[2]):
            sample = (float(rate.replace(",", "")), float(client), float(server))
            variant.rpc.setdefault((match[1], mode), []).append(sample)


def bench_codecs(variant: Variant) -> None:
    for script in ("bench_gotalk.py", "bench_chatter.py"):
        for line in variant.run(f"tests/benchmarks/{script}").splitlines():
            match = _CODEC.match(line)
            if match is not None and "hat-sbs" not in match[2]:
                label = " ".join(f"{match[1]} {match[2]}".split())
                best = variant.codec.get(label, float("inf"))
                variant.codec[label] = min(best, float(match[3]))


def run_tests(variant: Variant) -> None:
    tests = sorted(str(p.relative_to(variant.copy)) for t in TESTS for p in variant.copy.glob(t))
    print(f"\n== pytest in the {variant.name!r} copy: {len(tests)} files", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=variant.copy,
        env=variant.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = done.stdout.strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    for line in [*failures, lines[-1] if lines else "(no output)"]:
        print(f"  {line}")


def _change(value: float, base: float) -> str:
    return f"{(value - base) / base * 100:+4.0f}%" if base else "  n/a"


def report(variants: list[Variant], rounds: int) -> None:
    pure = variants[0]
    print(f"\nbench_rpc: medians of {rounds} round(s); CPU in microseconds per request")
    print(
        f"{'row':<18}{'mode':<13}{'variant':<10}{'rate':>10}  {'client CPU':>10}"
        f"  {'server CPU':>10}  {'server vs pure':>14}  {'server CPU range':>16}"
    )
    for key, base_samples in pure.rpc.items():
        base = statistics.median(s[2] for s in base_samples)
        for variant in variants:
            samples = variant.rpc.get(key)
            if not samples:
                continue
            rate = statistics.median(s[0] for s in samples)
            client = statistics.median(s[1] for s in samples)
            server = statistics.median(s[2] for s in samples)
            change = "" if variant is pure else _change(server, base)
            row, mode = key if variant is pure else ("", "")
            spread = f"{min(s[2] for s in samples):.1f}..{max(s[2] for s in samples):.1f}"
            print(
                f"{row:<18}{mode:<13}{variant.name:<10}{rate:>8,.0f}/s  {client:>7.1f} us"
                f"  {server:>7.1f} us  {change:>14}  {spread:>13} us"
            )
    if pure.codec:
        codec_table(variants)
    built = ", ".join(f"{v.name} {v.build_seconds:.0f} s" for v in variants[1:])
    print(f"\ncompile time: {built}")


def codec_table(variants: list[Variant]) -> None:
    pure = variants[0]
    print("\ncodec micro-benchmarks: us per call (best of all rounds), change against pure")
    print(f"{'':40}" + "".join(f"{v.name:>16}" for v in variants))
    for label, base in pure.codec.items():
        cells = [f"{base:>16.2f}"]
        for variant in variants[1:]:
            value = variant.codec.get(label)
            text = f"{value:.2f} {_change(value, base)}" if value is not None else "n/a"
            cells.append(f"{text:>16}")
        print(f"{label:<40}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="bench_rpc rounds per variant")
    parser.add_argument("--seconds", type=float, default=2.0, help="bench_rpc timed window")
    parser.add_argument("--only", action="append", help=f"bench_rpc row (default {ROWS})")
    parser.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS)[1:], default=list(VARIANTS)[1:]
    )
    parser.add_argument("--no-codec", action="store_true", help="skip the codec benchmarks")
    parser.add_argument("--tests", action="store_true", help="run the tests compiled too")
    args = parser.parse_args()
    rows = tuple(args.only or ROWS)
    with tempfile.TemporaryDirectory(prefix="peerwire-mypyc-") as parent:
        variants = [
            prepare(name, VARIANTS[name], Path(parent)) for name in ["pure", *args.variants]
        ]
        for round_no in range(args.rounds):
            shift = round_no % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                print(f"== round {round_no + 1}: {variant.name!r}", flush=True)
                bench_rpc(variant, rows, args.seconds)
                if not args.no_codec:
                    bench_codecs(variant)
        report(variants, args.rounds)
        if args.tests:
            run_tests(variants[-1])


if __name__ == "__main__":
    main()

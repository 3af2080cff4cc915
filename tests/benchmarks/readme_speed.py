"""The README's speed section, regenerated from the benchmarks:
``python tests/benchmarks/readme_speed.py [--smoke] [--print]``.

Runs ``bench_rpc.py`` on asyncio's loop and on uvloop (bare echo, peerwire Gotalk and
Chatter, hat-drivers' chatter; default rounds and window) and ``bench_workers.py`` (1 and
2 ``peerwire serve`` worker processes), each in a process of its own with ``--json``, and
rewrites the part of README.md between :data:`START` and :data:`END` with their figures,
stamped with the machine, the date and the commit they were measured on. Takes about five
minutes on two cores; run it on a quiet machine, from a clean tree, and commit the README
alone afterwards (the stamp names the commit measured).

``--print`` prints the section instead of writing it. ``--smoke`` (CI, through
``smoke.py``) runs every benchmark in its smoke mode and prints the section: the figures
are rough, and the README is left alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
README = ROOT / "README.md"
START = "<!-- speed: written by tests/benchmarks/readme_speed.py; edits here are lost -->"
END = "<!-- speed: end -->"
LOOPS = ("asyncio", "uvloop")
ROWS = (
    ("peerwire-gotalk", "peerwire, Gotalk (`tcp+gotalk`)"),
    ("peerwire-chatter", "peerwire, Hat Chatter (`tcp+sbs`)"),
    ("hat-chatter", "hat-drivers' chatter (the reference)"),
    ("bare-echo", "bare length-prefixed echo (no RPC layer)"),
)
"""bench_rpc's rows in the table, and what the README calls them."""
MODES = (("sequential", "one at a time"), ("inflight100", "100 in flight"))


def _run(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` with ``args`` and ``--json``; its figures (its output goes to ours)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "figures.json"
        command = [sys.executable, str(HERE / script), *args, "--json", str(out)]
        subprocess.run(command, cwd=ROOT, check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def measure(smoke: bool) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """bench_rpc's figures per loop, and bench_workers'."""
    quick = ["--smoke"] if smoke else []
    only = [f"--only={name}" for name, _ in ROWS]
    rpc_runs = {loop: _run("bench_rpc.py", *quick, *only, f"--loop={loop}") for loop in LOOPS}
    return rpc_runs, _run("bench_workers.py", *quick)


def machine() -> dict[str, str]:
    """What the figures were measured on: processor, cores, memory, system, Python, commit
    (marked when tracked files other than the README had changes), date."""
    model = "unknown processor"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = " ".join(line.split(":", 1)[1].split())
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split("MemTotal:", 1)[1].split()[0])
        memory = f", {kib / 2**20:.0f} GiB"
    system = platform.system()
    os_release = Path("/etc/os-release")
    if os_release.exists():
        for line in os_release.read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                system = line.split("=", 1)[1].strip('"')
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    # tracked files other than the README (which this run rewrites)
    status = [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!README.md"]
    changes = subprocess.run(status, capture_output=True, text=True)
    return {
        "machine": f"{model}, {os.cpu_count()} cores{memory}, {system}",
        "python": platform.python_version(),
        "commit": commit.stdout.strip() + (" with local changes" if changes.stdout.strip() else ""),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _cell(figures: dict[str, Any], name: str, mode: str) -> str:
    rows = figures["rows"]
    if name not in rows or mode not in rows[name]:
        return "not run"
    rate = rows[name][mode]["rate"]
    base = rows.get("bare-echo", {}).get(mode, {}).get("rate")
    ratio = f" ({rate / base:.2f}x)" if base and name != "bare-echo" else ""
    return f"{rate:,.0f}/s{ratio}"


def render(
    rpc_runs: dict[str, dict[str, Any]], workers: dict[str, Any], stamp: dict[str, str]
) -> str:
    """The section between the markers, markers included: the round-trip table, then the
    workers' line."""
    first = rpc_runs[LOOPS[0]]
    head = ["requests/s (share of the bare echo)"]
    head += [f"{loop}, {label}" for loop in LOOPS for _, label in MODES]
    lines = [
        START,
        f"Measured {stamp['date']} on {stamp['machine']} (Python {stamp['python']}), commit "
        f"{stamp['commit']}: one connection, 16-byte payloads, client and server in two "
        f"processes, medians of {first['rounds']} round{'s' if first['rounds'] > 1 else ''} of"
        f" {first['seconds']:g} s.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, label in ROWS:
        cells = [_cell(rpc_runs[loop], name, mode) for loop in LOOPS for mode, _ in MODES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    ops = workers["rows"]
    gains = ", ".join(
        f"`{op}` {two / one:.2f}x ({one:,.0f}/s -> {two:,.0f}/s)"
        for op in ("echo", "work")
        if op in ops
        for one, two in [(ops[op]["1"], ops[op]["2"])]
    )
    lines += [
        "",
        f"`peerwire serve --workers 2` against 1 worker on these {workers['cores']} cores"
        f" ({workers['loop']}; `echo` returns its payload, `work` spends about"
        f" {workers['work_us']:.0f} us of Python a call): {gains}.",
        END,
    ]
    return "\n".join(lines)


def replace_section(text: str, section: str) -> str:
    """``text`` with the part from :data:`START` to :data:`END` replaced by ``section``.
    Raises ValueError when the markers are missing or out of order."""
    start = text.find(START)
    end = text.find(END, start)
    if start < 0 or end < 0:
        raise ValueError(f"README.md lacks the markers {START!r} ... {END!r}")
    return text[:start] + section + text[end + len(END) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="smoke runs; print, not write")
    parser.add_argument("--print", action="store_true", help="print the section, not write")
    args = parser.parse_args()
    writes = not (args.smoke or args.print)
    if writes:
        replace_section(README.read_text(), "")  # no markers: said now, not after the runs
    stamp = machine()  # before the runs: the tree as measured
    section = render(*measure(args.smoke), stamp)
    if not writes:
        print(section)
        return
    README.write_text(replace_section(README.read_text(), section))
    print(f"README.md: speed section rewritten\n{section}")


if __name__ == "__main__":
    main()

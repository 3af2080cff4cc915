"""The middleware examples run as printed, and do what they say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str) -> str:
    done = subprocess.run(
        [sys.executable, f"examples/{name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_mtls_subject_authorisation() -> None:
    assert run_example("mtls_auth.py").splitlines() == [
        "alice: you are alice",
        "mallory: refused: mallory may not call whoami",
    ]


def test_rate_limiter_answers_with_retry_results() -> None:
    out = run_example("rate_limit.py")
    match = re.fullmatch(r"12 results \[(.*)\] in ([\d.]+) s after (\d+) retry results\n", out)
    assert match is not None, out
    assert [int(x) for x in match.group(1).split(", ")] == [i * i for i in range(12)]
    # 4 at once, then 20/s: the last of 12 cannot be let through before 8/20 s
    assert float(match.group(2)) >= 0.38
    assert int(match.group(3)) > 0

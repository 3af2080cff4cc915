"""``make demo`` must keep working: run examples/demo.py as the Makefile does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(90)
def test_demo_runs_and_succeeds() -> None:
    # its own process group: if the demo hangs, its server child is killed along with it
    demo = subprocess.Popen(
        [sys.executable, "examples/demo.py"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert demo.returncode == 0, out
    assert "Hello" in out
    assert "demo OK" in out

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


@pytest.mark.timeout(300)
def test_make_demo_builds_a_slim_venv_and_says_how_to_use_it(tmp_path: Path) -> None:
    """`make demo` in a fresh venv: the core alone (no Spark, no test tools), the demo
    passes, and the last lines say how to use the environment."""
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    demo = subprocess.Popen(
        ["make", "-s", "demo", f"VENV={venv}", f"PYTHON={sys.base_prefix}/bin/python3"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = demo.communicate(timeout=240)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert demo.returncode == 0, out
    assert "demo OK" in out
    assert f"source {venv}/bin/activate" in out
    assert (venv / "bin" / "peerwire").exists()
    installed = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.lower()
    assert "msgspec==" in installed
    for heavy in ("pyspark", "playwright", "pytest", "hat-drivers", "mkdocs"):
        assert f"{heavy}==" not in installed, heavy

"""`make test` runs pytest on every core (``-n auto --dist loadgroup``) and relies on
pytest-xdist's ``xdist_group`` marks to run Spark's tests on one worker, one after another
(tests/spark_session.py, ONE_SPARK_AT_A_TIME). With pytest 9.2 those marks group nothing,
silently (pytest-xdist#1386): this runs a small suite that way and fails if a group's tests
ran on two workers, so an upgrade that breaks it says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os
import pytest

group = pytest.mark.xdist_group("one")


def record(name):
    with open(os.environ["RECORD"], "a") as out:
        out.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("n", range(6))
@group
def test_grouped(n):
    record("grouped")


@pytest.mark.parametrize("n", range(6))
def test_free(n):
    record("free")
"""


def test_a_groups_tests_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    record = tmp_path / "record.txt"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    command += ["--dist", "loadgroup", "-c", os.devnull, "--rootdir", str(tmp_path)]
    done = subprocess.run(
        [*command, str(tmp_path)],
        env={**os.environ, "RECORD": str(record)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in record.read_text().splitlines()]
    grouped = {worker for name, worker in lines if name == "grouped"}
    assert len(lines) == 12, lines
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}: loadgroup is broken"

"""The README's quick-start code runs as printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_quick_start_runs() -> None:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'greeting': 'Hello Ada'}"


def test_operating_a_server_runs() -> None:
    section = README.read_text().split("## Operating a server", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["{'greeting': 'Hello Ada'}", "refused: say who you are"]
    server = 'op="greet",protocol="gotalk",side="server"'
    assert f'peerwire_requests_total{{kind="request",{server}}} 2.0' in lines
    assert f'peerwire_errors_total{{error="rejected",{server}}} 1.0' in lines

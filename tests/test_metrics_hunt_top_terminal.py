"""``peerwire top`` on a terminal (rich's live table, which hides the cursor): ended by
SIGTERM (``kill``), it shows the cursor again before it exits (helper-P's hunt)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from rpc.metrics import Metrics, start_http_server
from tests.test_cli import PEERWIRE, ROOT

SHOW_CURSOR = b"\x1b[?25h"
HIDE_CURSOR = b"\x1b[?25l"


@pytest.fixture
def endpoint() -> Iterator[int]:
    registry = CollectorRegistry()
    Metrics(registry)
    server, thread = start_http_server("127.0.0.1", 0, registry=registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


def read_until(fd: int, wanted: bytes, seen: bytearray, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed its end
            return False
        if not data:
            return False
        seen += data
    return True


def test_sigterm_shows_the_cursor_again(endpoint: int) -> None:
    """Killed with the cursor hidden (rich's Live hides it), the terminal was left without
    one: the process died on the signal, and the live view's clean-up never ran."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [*PEERWIRE, "top", f"127.0.0.1:{endpoint}", "--interval", "0.2"],
        cwd=ROOT,
        stdin=child,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    seen = bytearray()
    try:
        assert read_until(main, b"connections open", seen, 20), bytes(seen)
        assert HIDE_CURSOR in seen
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=10)
        read_until(main, b"\x00never", seen, 0.5)  # whatever it wrote before it exited
    finally:
        if process.returncode is None:
            process.kill()
            process.wait()
        os.close(main)
    assert code == 128 + signal.SIGTERM, code
    assert seen.rfind(SHOW_CURSOR) > seen.rfind(HIDE_CURSOR), bytes(seen[-200:])

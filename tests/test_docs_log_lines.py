"""The log lines docs/reconnect.md prints (its ``<!-- log: ... -->`` text block) are the
lines a reconnecting client logs: each printed line, its address, wait and OS error made
general, matches a line logged in a real drop, failed attempt and reconnect on 127.0.0.1.

tests/test_docs.py runs the pages' programs; this block is a sample of a log on another
host (10.0.0.5), so it is checked here by shape instead.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

import rpc
from rpc.reconnect import ConnectionState, Transition

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reconnect.md"
MARKER = "<!-- log: tests/test_docs_log_lines.py -->"
DOC_URL = "tcp+gotalk://10.0.0.5:7000"


def printed_lines() -> list[str]:
    """The lines of the text block right after :data:`MARKER` on the page."""
    text = PAGE.read_text()
    assert text.count(MARKER) == 1, f"{PAGE.name}: no single {MARKER}"
    block = re.search(re.escape(MARKER) + r"\s*```text\n(.*?)\n```", text, re.S)
    assert block is not None, f"{PAGE.name}: no text block after {MARKER}"
    return block.group(1).splitlines()


PLACES = {  # a part of a printed line -> what it stands for in a local run
    DOC_URL: r"tcp\+gotalk://127\.0\.0\.1:\d+",
    "[Errno 111] Connect call failed ('10.0.0.5', 7000)": r"\[Errno \d+\] [^()]+(\([^()]*\))?",
    "...": r".+",
}


def shape(line: str) -> re.Pattern[str]:
    """A printed line as a pattern: any local URL, wait and OS error; ``...`` any text."""
    parts = re.split(r"(in \d+\.\d+ s|" + "|".join(map(re.escape, PLACES)) + ")", line)
    pattern = ""
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part in PLACES:
            pattern += PLACES[part]
        else:
            pattern += r"in \d+\.\d{3} s"
    return re.compile(pattern)


async def test_reconnect_page_log_lines_are_what_the_client_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="peerwire.rpc")
    registry = rpc.Registry()
    registry.handle("ping")(lambda _value: "pong")
    server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry)
    url = str(server.url)
    failed = asyncio.Event()

    def on_state(change: Transition) -> None:
        if change.state is ConnectionState.RECONNECTING and change.failures >= 1:
            failed.set()  # an attempt against the closed port failed, and was logged

    policy = rpc.Reconnect(backoff=rpc.Backoff(base=0.01, cap=0.05))
    try:
        async with rpc.connect(url, reconnect=policy, on_state=on_state) as peer:
            assert await peer.request("ping") == "pong"  # answered: the drop is a lost one
            await server.close()
            await asyncio.wait_for(failed.wait(), 5)
            server = await rpc.serve(url, registry=registry)  # back, on the same port
            assert await peer.request("ping", timeout=5) == "pong"
    finally:
        await server.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "peerwire.rpc"]
    for line in printed_lines():
        assert any(shape(line).fullmatch(m) for m in logged), (line, logged)

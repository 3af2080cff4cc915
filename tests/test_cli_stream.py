"""``peerwire stream`` into files and pipes: long streams keep up, output is not held back."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import rpc
from tests.test_cli import GREET, PEERWIRE, ROOT, Serving

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_long_stream_into_a_file(loop: str, tmp_path: Path) -> None:
    """20,000 small results arrive faster than a write per line could keep up with, and
    on uvloop (the default when installed: the CLI runs on it whatever --loop the tests
    run on) many more in one read than the default max_stream_queue (256). Before, the
    stream failed with a StreamOverflow traceback after a few thousand lines."""
    listen = ("--listen", "tcp+gotalk://127.0.0.1:0", "--listen", "tcp+sbs://127.0.0.1:0")
    with Serving(GREET, *listen) as server:
        files = [tmp_path / "gotalk.jsonl", tmp_path / "chatter.jsonl"]
        processes = []
        for url, path in zip(server.urls(2), files, strict=True):
            with path.open("w") as out:  # the child holds its own copy of the descriptor
                processes.append(
                    subprocess.Popen(
                        [*PEERWIRE, "stream", url, "count", '{"to": 20000}'],
                        cwd=ROOT,
                        stdout=out,
                        stderr=subprocess.PIPE,
                        text=True,
                        env={**os.environ, "PEERWIRE_LOOP": loop},
                    )
                )
        try:
            for process, path in zip(processes, files, strict=True):
                _, err = process.communicate(timeout=60)
                assert (process.returncode, err) == (0, ""), path.name
                lines = path.read_text().splitlines()
                assert len(lines) == 20_000, path.name
                assert (lines[0], lines[-1]) == ("1", "20000")
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        assert server.stop() == 0


async def test_results_reach_a_pipe_while_the_stream_goes_on() -> None:
    """Buffered output is flushed shortly after a result, not only at the end: the stream
    ends only once the test has read its first result from the pipe."""
    seen = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("tick")
    async def tick(value: object) -> AsyncIterator[int]:
        yield 1
        await seen.wait()
        yield 2

    server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry)
    process = await asyncio.create_subprocess_exec(
        *PEERWIRE, "stream", str(server.url), "tick", cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            assert await process.stdout.readline() == b"1\n"
            seen.set()
            assert await process.stdout.read() == b"2\n"
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await server.close(drain_timeout=0.1)

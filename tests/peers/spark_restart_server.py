"""A Gotalk peer that records every call it runs, for the Spark restart tests.

    python tests/peers/spark_restart_server.py PORT LOG

Serves ``work`` (n -> n * 3, after 2 ms) on 127.0.0.1:PORT (0: a free port), prints
``PORT <n>`` once listening and runs until killed. Each call appends ``n`` to LOG with one
unbuffered write before it is answered, so the count survives ``kill -9``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc


async def main(port: int, log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    registry = rpc.Registry()

    @registry.handle("work")
    async def work(n: int) -> int:
        os.write(fd, b"%d\n" % n)
        await asyncio.sleep(0.002)  # the handler's work (not a wait)
        return n * 3

    server = await rpc.serve(f"tcp+gotalk://127.0.0.1:{port}", registry=registry).start()
    print(f"PORT {server.url.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))

"""Run hat-event 0.9.44's full event server (lmdb backend) on 127.0.0.1 until stdin closes.

    python tests/peers/eventer_hat_server.py PORT DB_PATH [SERVER_ID]

Prints ``ready`` once the engine is OPERATIONAL (a probe client saw the status), so a
caller can start measuring right away. Used by tests/benchmarks/bench_eventer.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from hat.drivers import net
from hat.event import common, eventer
from hat.event.server.main_runner import MainRunner


def hat_server_conf(port: int, db_path: str, server_id: int = 1) -> dict:
    """MainRunner config: lmdb backend keeping latest and timeseries of every type."""
    return {
        "name": "event-server",
        "server_id": server_id,
        "backend": {
            "module": "hat.event.backends.lmdb",
            "db_path": db_path,
            "identifier": None,
            "flush_period": 1,
            "cleanup_period": 60,
            "conditions": [],
            "latest": {"subscriptions": [["*"]]},
            "timeseries": [
                {"order_by": "TIMESTAMP", "subscriptions": [["*"]]},
                {"order_by": "SOURCE_TIMESTAMP", "subscriptions": [["*"]]},
            ],
        },
        "modules": [],
        "eventer_server": {"host": "127.0.0.1", "port": port},
    }


async def wait_operational(port: int, timeout: float = 20.0) -> None:
    """Connect probe clients until one reports OPERATIONAL."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                client = await eventer.connect(net.TcpAddress("127.0.0.1", port), "probe")
            except (ConnectionError, OSError):
                await asyncio.sleep(0.05)
                continue
            try:
                while client.status != common.Status.OPERATIONAL and client.is_open:
                    await asyncio.sleep(0.02)
                if client.status == common.Status.OPERATIONAL:
                    return
            finally:
                await client.async_close()


@contextlib.asynccontextmanager
async def hat_full_server(db_path: Path, server_id: int = 1) -> AsyncIterator[str]:
    """hat-event's full server in-process on a free port; yields its peerwire URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    runner = MainRunner(hat_server_conf(port, str(db_path), server_id))
    try:
        await wait_operational(port)
        yield f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
    finally:
        await runner.async_close()


async def main() -> None:
    port, db_path = int(sys.argv[1]), sys.argv[2]
    server_id = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    runner = MainRunner(hat_server_conf(port, db_path, server_id))
    await wait_operational(port)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await runner.async_close()


if __name__ == "__main__":
    asyncio.run(main())

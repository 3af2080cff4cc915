"""N forked worker processes serving with metrics, one ``/metrics`` showing them all.

Run by tests/test_metrics_workers.py as ``python tests/metrics_workers.py DIR N``: what a
multi-worker server does (the workers here are plain forked processes, each with a server of
its own port). Prints ``METRICS <port>`` and ``WORKER <i> <pid> <port>``; reads commands on
stdin: ``kill <i>`` ends worker i (then ``KILLED <i>``); end of input stops everything.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rpc.metrics_dir import prepare  # before prometheus_client is imported


async def _serve(conn: multiprocessing.connection.Connection) -> None:
    import rpc
    from rpc.metrics import Metrics

    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: object) -> object:
        return value

    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry, metrics=Metrics()) as s:
        conn.send(s.url.port)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()


def _worker(conn: multiprocessing.connection.Connection) -> None:
    asyncio.run(_serve(conn))


def main() -> None:
    prepare(sys.argv[1])
    count = int(sys.argv[2])
    mp = multiprocessing.get_context("fork")
    workers = []
    for index in range(count):
        parent_end, child_end = mp.Pipe()
        process = mp.Process(target=_worker, args=(child_end,), daemon=True)
        process.start()
        if not parent_end.poll(30):
            raise SystemExit(f"worker {index} did not start")
        workers.append(process)
        print(f"WORKER {index} {process.pid} {parent_end.recv()}", flush=True)

    from rpc.metrics import start_http_server, worker_exited

    server, _ = start_http_server("127.0.0.1", 0)
    print(f"METRICS {server.server_port}", flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "kill":
            process = workers[int(arg)]
            os.kill(process.pid, signal.SIGKILL)
            process.join(10)
            worker_exited(process.pid)
            print(f"KILLED {arg}", flush=True)
    for process in workers:
        if process.is_alive():
            process.terminate()
            process.join(10)
    server.shutdown()


if __name__ == "__main__":
    main()

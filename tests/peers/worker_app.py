"""Handlers that tell which worker process and loop answered, for ``--workers`` tests.

Served by ``peerwire serve tests/peers/worker_app.py --workers N ...``, or through the API:

    python tests/peers/worker_app.py URL [URL ...] --workers N [--loop L] [--shared-socket]
        [--crash-at-start]

which calls :func:`rpc.workers.serve_workers` and prints ``listening on URL`` per URL once
every worker serves.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script from anywhere: the project's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc

registry = rpc.Registry()


@registry.handle("pid")
def pid(value: Any) -> int:
    """The worker's process id."""
    return os.getpid()


@registry.handle("loop")
def loop(value: Any) -> list[Any]:
    """``[pid, module of the running loop's class]``: ``uvloop`` or ``asyncio...``."""
    return [os.getpid(), type(asyncio.get_running_loop()).__module__]


@registry.handle("slow")
async def slow(seconds: float) -> int:
    """Prints ``slow started PID`` (so a test knows the request is in flight), works for
    ``seconds``, then answers the pid."""
    print(f"slow started {os.getpid()}", flush=True)
    await asyncio.sleep(seconds)
    return os.getpid()


@registry.handle("caller_loop")
async def caller_loop(value: Any) -> Any:
    """Calls back the caller's own ``loop`` op: tells which loop the caller runs on."""
    return await rpc.current_peer.get().request("loop")


def main() -> None:
    from rpc.workers import serve_workers

    parser = argparse.ArgumentParser()
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--loop")
    parser.add_argument("--shared-socket", action="store_true", help="reuse_port=False")
    parser.add_argument(
        "--crash-at-start", action="store_true", help="an invalid rpc.serve option: workers fail"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def ready(urls: list[str]) -> None:
        for url in urls:
            print(f"listening on {url}", flush=True)

    kwargs: dict[str, Any] = {"reuse_port": False} if args.shared_socket else {}
    if args.crash_at_start:
        kwargs["options"] = "not an rpc.Options"
    serve_workers(
        args.urls,
        workers=args.workers,
        registry=registry,
        loop=args.loop,
        on_ready=ready,
        **kwargs,
    )


if __name__ == "__main__":
    main()

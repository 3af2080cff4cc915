"""WebSocket request throughput: ``python tests/benchmarks/bench_websocket.py [--seconds S]``.

Not collected by pytest. This process is the client; each row's server runs in a process of
its own (this script with ``--serve NAME``: it prints ``PORT <n>``, answers every ``cpu``
line on stdin with its CPU seconds, and serves until stdin closes).

Rows (``--only`` takes one):

- ``peerwire-ws-gotalk``: ``rpc.serve("ws+gotalk://...")`` with handler ``echo(data: bytes)``,
  client ``rpc.connect(...)`` and ``peer.request("echo", payload, raw=True)``. Every Gotalk
  message is two WebSocket frames (header, then payload), as browser peers need.
- ``peerwire-ws-sbs``: the same over ``ws+sbs://`` (Chatter frames in binary messages).
- ``peerwire-tcp-gotalk``: the same handler over plain TCP, to show what WebSocket costs.
- ``bare-websockets``: the baseline: a ``websockets`` echo server (``async for message in ws:
  await ws.send(message)``) and a client that resolves replies in order; one frame each way,
  no RPC at all.

``--loop asyncio|uvloop`` picks the event loop of both processes (the server inherits it
through ``PEERWIRE_BENCH_LOOP``).

Modes, each on one connection with a 16-byte payload: ``sequential`` (one request at a time)
and ``inflight100`` (100 workers, so 100 requests are always outstanding). After a warm-up
the completed requests are counted over ``--seconds``; every reply is checked. Absolute
figures drift with the machine: compare the ratios against ``bare-websockets`` measured in
the same run. ``--smoke`` (CI) is ``--seconds 0.2 --rounds 1`` (warm-up 0.05 s): every row
runs and is compared as usual, but the figures are rough.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

import rpc
from tests.benchmarks.harness import PAYLOAD, ServerProcess, measure, serve_until_stdin_closes

HOST = "127.0.0.1"
ROWS = ("peerwire-ws-gotalk", "peerwire-ws-sbs", "peerwire-tcp-gotalk", "bare-websockets")
URLS = {
    "peerwire-ws-gotalk": "ws+gotalk://{host}:{port}/gotalk/",
    "peerwire-ws-sbs": "ws+sbs://{host}:{port}/gotalk/",
    "peerwire-tcp-gotalk": "tcp+gotalk://{host}:{port}",
}
CLIENT_QUERY = {"peerwire-ws-sbs": "?dialect=HatChatter"}
MODES = (("sequential", 1), ("inflight100", 100))
LOOP_ENV = "PEERWIRE_BENCH_LOOP"
NOTES = (
    ("Go gotalk over WebSocket, sequential", "~15,900/s"),
    ("Go gotalk over WebSocket, 100 in flight", "~33,000/s"),
    ("Go gotalk over TCP, sequential", "~20,800/s"),
    ("Go gotalk over TCP, 100 in flight", "~65,000/s"),
)

T = TypeVar("T")
Call = Callable[[], Awaitable[bytes]]
Close = Callable[[], Awaitable[None]]


# --- servers (in the subprocess) ------------------------------------------------------------


async def start_server(name: str) -> tuple[int, Close]:
    if name in URLS:
        registry = rpc.Registry()

        @registry.handle("echo")
        def echo(data: bytes) -> bytes:
            return data

        server = await rpc.serve(URLS[name].format(host=HOST, port=0), registry=registry)
        return server.url.port, server.close

    async def echo_back(ws: ServerConnection) -> None:
        async for message in ws:
            await ws.send(message)

    bare = await ws_serve(echo_back, HOST, 0, compression=None)

    async def close() -> None:
        bare.close()
        await bare.wait_closed()

    return bare.sockets[0].getsockname()[1], close


async def serve(name: str) -> None:
    port, close = await start_server(name)
    await serve_until_stdin_closes(port, close)


# --- clients (here) ---------------------------------------------------------------------------


async def connect(name: str, port: int) -> tuple[Call, Close]:
    if name in URLS:
        url = URLS[name].format(host=HOST, port=port) + CLIENT_QUERY.get(name, "")
        peer = await rpc.connect(url, registry=rpc.Registry())
        request = peer.request
        return (lambda: request("echo", PAYLOAD, raw=True)), peer.close

    ws = await ws_connect(f"ws://{HOST}:{port}/", compression=None)
    loop = asyncio.get_running_loop()
    waiters: collections.deque[asyncio.Future[bytes]] = collections.deque()

    async def read_replies() -> None:  # the echo server answers in order
        async for message in ws:
            waiters.popleft().set_result(message)  # type: ignore[arg-type]

    reader = loop.create_task(read_replies())

    async def call() -> bytes:
        future = loop.create_future()
        waiters.append(future)
        await ws.send(PAYLOAD)
        return await future

    async def close() -> None:
        await ws.close()
        await reader

    return call, close


async def run_row(name: str, seconds: float) -> dict[str, tuple[float, float, float]]:
    server = ServerProcess(name, script=__file__)
    try:
        results = {}
        for mode, inflight in MODES:
            call, close = await connect(name, server.port)
            try:
                sample = await measure(call, inflight, seconds, server)
                results[mode] = (sample.rate, sample.client_us, sample.server_us)
            finally:
                await close()
        return results
    finally:
        server.close()


def run(coro: Awaitable[T]) -> T:
    """``asyncio.run`` on the loop chosen with ``--loop`` (inherited by server processes)."""
    if os.environ.get(LOOP_ENV, "asyncio") == "uvloop":
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed window per mode")
    parser.add_argument("--rounds", type=int, default=3, help="repeat every row; report medians")
    parser.add_argument("--only", choices=ROWS, help="run one row (plus the baseline)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), help="event loop (both sides)")
    parser.add_argument("--smoke", action="store_true", help="--seconds 0.2 --rounds 1 (CI)")
    parser.add_argument("--serve", choices=ROWS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        os.environ[LOOP_ENV] = args.loop
    if args.serve:
        run(serve(args.serve))
        return

    if args.smoke:
        args.seconds, args.rounds = 0.2, 1
    rows = ROWS if args.only is None else tuple(dict.fromkeys((args.only, "bare-websockets")))
    samples: dict[tuple[str, str], list[tuple[float, float, float]]] = collections.defaultdict(list)
    for round_number in range(args.rounds):
        for name in rows:  # rows interleave, so a slow spell of the machine hits all of them
            for mode, sample in run(run_row(name, args.seconds)).items():
                samples[name, mode].append(sample)
                print(
                    f"round {round_number + 1}: {name:<20}{mode:<13}{sample[0]:>9,.0f}/s",
                    flush=True,
                )

    def median(name: str, mode: str, index: int = 0) -> float:
        return statistics.median(s[index] for s in samples[name, mode])

    print(
        f"\nmedian of {args.rounds} round(s) on {os.environ.get(LOOP_ENV, 'asyncio')}, "
        f"{len(PAYLOAD)}-byte payload, one connection; "
        "CPU = microseconds of process CPU per request"
    )
    print(
        f"{'row':<22}{'mode':<13}{'rate':>10}  {'vs bare-websockets':<20}"
        f"{'client CPU':>11}{'server CPU':>12}"
    )
    for name in rows:
        for mode, _ in MODES:
            rate, base = median(name, mode), median("bare-websockets", mode)
            print(
                f"{name:<22}{mode:<13}{rate:>9,.0f}/s  {rate / base:>6.2f}x{'':<13}"
                f"{median(name, mode, 1):>8.1f} us{median(name, mode, 2):>9.1f} us"
            )
    print("\nreference figures (Go peers, measured apart on a 2-core machine):")
    for what, figure in NOTES:
        print(f"  {what:<45}{figure:>10}")


if __name__ == "__main__":
    main()

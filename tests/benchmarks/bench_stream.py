"""Streams, coroutine handlers and calls with a timeout next to single calls:
``python tests/benchmarks/bench_stream.py [--seconds S] [--rounds N] [--loop asyncio|uvloop]
[--smoke]``.

Not collected by pytest. The two-process harness of ``bench_rpc.py`` (``harness.py``): this
process is the client, each row's server a subprocess of this script. Rows, over
``tcp+gotalk://`` and ``tcp+sbs://...?dialect=HatChatter``:

- ``<protocol>-request``: ``peer.request("echo", payload, raw=True)`` answered by a plain
  ``echo(data: bytes)``: the baseline, measured in the same run.
- ``<protocol>-async``: the same request answered by ``async def echo_async``.
- ``<protocol>-timed``: ``peer.request("echo_async", payload, raw=True, timeout=60)``: a
  caller that chose a timeout, so each request goes with its metadata (the time left),
  and the server bounds the handler by it and gives it ``rpc.current_call``; compared with
  the ``async`` row of the same run.
- ``<protocol>-stream``: ``peer.stream("halves", value=payload, raw=True)`` answered by an
  async generator that yields the payload's two halves, which the caller joins: a request
  whose result comes as two parts and an end (the parts of one step go out together).
- ``<protocol>-upload``: ``peer.stream("joined", parts=halves, raw=True)``: a stream request
  whose two parts (the payload's halves) a stream handler reads and returns joined as a
  single result: the request's parts and its end, then one result.

Each row runs ``sequential`` (one call at a time) and ``inflight100`` (100 workers, one call
each at a time) on a fresh connection, 16-byte payloads, after a warm-up of 0.5 s; every
worker checks what it got back. Every row runs ``--rounds`` times (default 3, rows
interleaved, a new server each time); the table shows median rates, the slowest..fastest
round, the median CPU per call of each side, and each row's rate as a share of its
protocol's request row (the timed row's: of its async row). ``--smoke`` (CI):
``--seconds 0.2 --rounds 1``, rough figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
import rpc.loops
from tests.benchmarks.harness import (
    PAYLOAD,
    Call,
    Close,
    Sample,
    ServerProcess,
    measure,
    serve_until_stdin_closes,
)

HOST = "127.0.0.1"
KINDS = ("request", "async", "timed", "stream", "upload")
ROWS = tuple(f"{protocol}-{kind}" for protocol in ("gotalk", "chatter") for kind in KINDS)
MODES = (("sequential", 1), ("inflight100", 100))
URLS = {"gotalk": "tcp+gotalk://{}:{}", "chatter": "tcp+sbs://{}:{}?dialect=HatChatter"}


def _registry() -> rpc.Registry:
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(data: bytes) -> bytes:
        return data

    @registry.handle("echo_async")
    async def echo_async(data: bytes) -> bytes:
        return data

    @registry.handle("halves")
    async def halves(data: bytes) -> AsyncIterator[bytes]:
        middle = len(data) // 2
        yield data[:middle]
        yield data[middle:]

    @registry.handle_stream("joined")
    async def joined(parts: AsyncIterator[bytes]) -> bytes:
        return b"".join([part async for part in parts])

    return registry


async def _serve(name: str) -> None:
    protocol = name.split("-")[0]
    server = await rpc.serve(URLS[protocol].format(HOST, 0), registry=_registry())
    await serve_until_stdin_closes(server.url.port, server.close)


async def _connect(name: str, port: int) -> tuple[Call, Close]:
    protocol, kind = name.split("-")
    peer = await rpc.connect(URLS[protocol].format(HOST, port), registry=rpc.Registry())
    request, stream = peer.request, peer.stream

    async def call_request() -> bytes:
        return await request("echo", PAYLOAD, raw=True)  # type: ignore[no-any-return]

    async def call_async() -> bytes:
        return await request("echo_async", PAYLOAD, raw=True)  # type: ignore[no-any-return]

    async def call_timed() -> bytes:
        result = await request("echo_async", PAYLOAD, raw=True, timeout=60)
        return result  # type: ignore[no-any-return]

    async def call_stream() -> bytes:
        return b"".join([part async for part in stream("halves", value=PAYLOAD, raw=True)])

    halves = (PAYLOAD[:8], PAYLOAD[8:])

    async def call_upload() -> bytes:
        (result,) = [result async for result in stream("joined", parts=halves, raw=True)]
        return result  # type: ignore[no-any-return]

    calls = {
        "request": call_request,
        "async": call_async,
        "timed": call_timed,
        "stream": call_stream,
        "upload": call_upload,
    }
    return calls[kind], peer.close


async def _row(name: str, server: ServerProcess, seconds: float) -> dict[str, Sample]:
    results = {}
    for mode, inflight in MODES:
        call, close = await _connect(name, server.port)
        try:
            results[mode] = await measure(call, inflight, seconds, server)
        finally:
            await close()
    return results


def bench_row(name: str, seconds: float) -> dict[str, Sample]:
    server = ServerProcess(name, __file__)
    try:
        return rpc.loops.run(_row(name, server, seconds))
    finally:
        server.close()


def report(results: dict[str, dict[str, list[Sample]]], rounds: int) -> None:
    print(f"\nmedians of {rounds} round(s); CPU: microseconds of process CPU per call")
    print(f"{'row':<17}{'mode':<13}{'rate':>11}  {'range':^21}  {'client':>9}  {'server':>9}")
    rate: dict[tuple[str, str], float] = {}
    for name, modes in results.items():
        for mode, samples in modes.items():
            rate[name, mode] = median = statistics.median(s.rate for s in samples)
            low, high = min(s.rate for s in samples), max(s.rate for s in samples)
            client = statistics.median(s.client_us for s in samples)
            server = statistics.median(s.server_us for s in samples)
            print(
                f"{name:<17}{mode:<13}{median:>9,.0f}/s  {low:>9,.0f}..{high:<10,.0f}"
                f"  {client:>6.1f} us  {server:>6.1f} us"
            )
    print("\nvs a single request, same protocol, this run (stream: two result parts;")
    print("upload: two request parts; timed: vs the async row):")
    for protocol in URLS:
        for kind in KINDS[1:]:
            base = "async" if kind == "timed" else "request"
            for mode, _ in MODES:
                row = rate.get((f"{protocol}-{kind}", mode))
                single = rate.get((f"{protocol}-{base}", mode))
                share = f"{row / single:.2f}" if row and single else "n/a"
                print(f"  {protocol:<8}{kind:<8}{mode:<13}{share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed window per mode")
    parser.add_argument("--rounds", type=int, default=3, help="repeat every row; report medians")
    parser.add_argument("--smoke", action="store_true", help="--seconds 0.2 --rounds 1 (CI)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--serve", choices=ROWS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ[rpc.loops.ENV_VAR] = args.loop  # read by rpc.loops.run here and in servers
    if args.serve:
        rpc.loops.run(_serve(args.serve))
        return
    if args.smoke:
        args.seconds, args.rounds = 0.2, 1
    print(f"event loop: {args.loop} (client and servers)", flush=True)
    results: dict[str, dict[str, list[Sample]]] = {}
    for round_no in range(1, max(1, args.rounds) + 1):
        for name in ROWS:
            samples = bench_row(name, args.seconds)
            for mode, sample in samples.items():
                results.setdefault(name, {}).setdefault(mode, []).append(sample)
            line = ", ".join(f"{mode} {s.rate:,.0f}/s" for mode, s in samples.items())
            print(f"round {round_no}  {name:<16} {line}", flush=True)
    report(results, max(1, args.rounds))


if __name__ == "__main__":
    main()

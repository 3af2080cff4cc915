"""End-to-end RPC benchmark: ``python tests/benchmarks/bench_rpc.py [--seconds S] [--only NAME]``.

Not collected by pytest. Client and server run in separate processes on 127.0.0.1: this
process is the client, and each row starts its server as a subprocess of this script
(``--serve NAME``), which prints ``PORT <n>`` and serves until its stdin closes (the
harness shared with ``bench_websocket.py`` is ``harness.py``).

Rows (``--only`` takes one of these names; repeat it for several):

- ``peerwire-chatter``: ``tcp+sbs://...?dialect=HatChatter``, handler ``echo(data: bytes)``,
  ``peer.request("echo", payload, raw=True)``: no JSON anywhere.
- ``peerwire-gotalk``: ``tcp+gotalk://``, same handler and call.
- ``peerwire-gotalk-async``: ``tcp+gotalk://`` with ``async def echo``: what a coroutine
  handler costs next to the plain function (run by the connection's worker tasks, several
  calls in one worker when they do not wait: :mod:`rpc.handler_runner`).
- ``peerwire-gotalk-mw``: the same with one pass-through middleware on each side
  (``serve(middleware=...)`` and ``connect(middleware=...)``): what the middleware path
  costs next to the plain one, which has none.
- ``peerwire-gotalk-one``: the same as ``peerwire-gotalk`` with ``connect(...,
  reconnect=False)``: the one connection's Peer, without the reconnecting client around it
  (what that client costs).
- ``hat-chatter``: the reference, hat-drivers' chatter on both sides. The server answers
  each message in its conversation; the client sends with ``last=False`` and a receive
  loop resolves futures keyed by ``conv.first_id``.
- ``gotalk-minimal-client``: peerwire's Gotalk server (as ``peerwire-gotalk``) called by
  the least client Gotalk allows (``floor_peers.MinimalGotalkClient``: no timeouts,
  retries, limits or checks): what the server allows a client, and, next to
  ``peerwire-gotalk``, what peerwire's own client costs.
- ``bare-echo``: asyncio.Protocol on both sides, 4-byte big-endian length prefix, the
  server echoes every whole frame of one read with one write and the client coalesces the
  writes of one loop iteration (the peerwire core does too, but cuts them into writes of
  16 messages): the ceiling (``floor_peers``).

Each row is measured in two modes, each on a fresh connection, with a 16-byte payload:
``sequential`` (one request at a time) and ``inflight100`` (100 workers each awaiting one
request at a time, so 100 are always outstanding). After a warm-up of 0.5 s, completed
requests are counted over ``--seconds``. Every worker checks that it got its payload back.
Timers are left at their defaults (peerwire ping/heartbeat, hat-drivers ping), which is
what users get.

Every row runs ``--rounds`` times (default 3, rows interleaved, a new server process each
time); the table shows the median rate, the slowest..fastest round, and the median process
CPU time per request of each side (client: this process; server: asked over its stdin at
the start and end of the window). Absolute rates drift by 2x on small VMs (where the
scheduler puts the two processes matters), so compare the ratios against ``bare-echo``
measured in the same run, and the CPU figures, which are steadier. At 100 in flight the
peerwire sides write bursts of 16 messages, so client and server work at the same time and
the rate can pass 1 / (client CPU + server CPU) per request when each has a core of its
own. ``--pin`` puts the client on CPU 0 and the servers on CPU 1.

``--loop uvloop`` runs both sides of every row on uvloop (``pip install 'peerwire[speed]'``;
the bare echo and hat-drivers' rows too, so the ratios compare like with like); the default
is asyncio's own loop.

``--smoke`` (CI) is ``--seconds 0.2 --rounds 1`` with a 0.05 s warm-up: every row runs and
is compared with ``bare-echo`` as usual, but the figures are rough.

``--json PATH`` also writes the table's figures (per row and mode: the median rate, the
slowest and fastest round, the median CPU per request of each side) as JSON, for
``readme_speed.py``, which puts them in the README.

``--profile DIR`` runs one round of the ``inflight100`` measurement only and profiles the
timed window on both sides: cProfile data to ``DIR/<row>-{client,server}.prof``, or with
``--profiler pyinstrument`` (``pip install pyinstrument``) text reports to ``.txt`` files.
Profilers slow both sides down several times, so the rates printed with them mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
import rpc.loops
from tests.benchmarks.floor_peers import BareEchoClient, BareEchoServer, MinimalGotalkClient
from tests.benchmarks.harness import (
    PAYLOAD,
    Call,
    Profile,
    Sample,
    ServerProcess,
    measure,
    serve_until_stdin_closes,
)

HOST = "127.0.0.1"
ROWS = (
    "peerwire-chatter",
    "peerwire-gotalk",
    "peerwire-gotalk-async",
    "peerwire-gotalk-mw",
    "peerwire-gotalk-one",
    "hat-chatter",
    "gotalk-minimal-client",
    "bare-echo",
)
MINIMAL = "gotalk-minimal-client"
MODES = (("sequential", 1), ("inflight100", 100))

NOTES = (
    ("Go gotalk server + Go client, 100 in flight (7 B)", "~65,000/s", "Go reference peers"),
    ("Go gotalk server + Go client, sequential (7 B)", "~20,800/s", "Go reference peers"),
    ("hat-drivers chatter, 100 conversations in flight", "~20,000/s", "hat-drivers reference"),
    ("hat-drivers chatter, sequential", "~2,700/s", "hat-drivers reference"),
    ("bare asyncio length-prefixed echo, sequential", "~12,000/s", "hat-drivers reference"),
)


# --- servers (run in the subprocess) ------------------------------------------------------


async def _pass_through(call: rpc.Call, call_next: Callable[[rpc.Call], Awaitable[Any]]) -> Any:
    """The cheapest middleware: what running the chain itself costs."""
    return await call_next(call)


def _registry(coroutine: bool = False) -> rpc.Registry:
    registry = rpc.Registry()
    if coroutine:

        @registry.handle("echo")
        async def async_echo(data: bytes) -> bytes:
            return data

    else:

        @registry.handle("echo")
        def echo(data: bytes) -> bytes:
            return data

    return registry


async def _start_server(name: str) -> tuple[int, Callable[[], Awaitable[None]]]:
    """Start row ``name``'s server on a free port; return (port, async close)."""
    if name in ("peerwire-chatter", "peerwire-gotalk", "peerwire-gotalk-one", MINIMAL):
        codec = "sbs" if name == "peerwire-chatter" else "gotalk"
        server = await rpc.serve(f"tcp+{codec}://{HOST}:0", registry=_registry())
        return server.url.port, server.close
    if name == "peerwire-gotalk-async":
        server = await rpc.serve(f"tcp+gotalk://{HOST}:0", registry=_registry(coroutine=True))
        return server.url.port, server.close
    if name == "peerwire-gotalk-mw":
        server = await rpc.serve(
            f"tcp+gotalk://{HOST}:0", registry=_registry(), middleware=[_pass_through]
        )
        return server.url.port, server.close
    if name == "hat-chatter":
        from hat.drivers import chatter, net

        async def echo_loop(conn: chatter.Connection) -> None:
            try:
                while True:
                    msg = await conn.receive()
                    await conn.send(chatter.Data("Res", msg.data.data), conv=msg.conv)
            except ConnectionError:
                pass

        def on_connection(conn: chatter.Connection) -> None:
            conn.async_group.spawn(echo_loop, conn)

        hat_server = await chatter.listen(on_connection, net.TcpAddress(HOST, 0))
        return hat_server.info.addresses[0].port, hat_server.async_close
    if name == "bare-echo":
        loop = asyncio.get_running_loop()
        bare = await loop.create_server(BareEchoServer, HOST, 0)

        async def close() -> None:
            bare.close()

        return bare.sockets[0].getsockname()[1], close
    raise SystemExit(f"unknown row {name!r}; choose from {', '.join(ROWS)}")


async def _serve(name: str, profile: Profile | None) -> None:
    port, close = await _start_server(name)
    await serve_until_stdin_closes(port, close, profile)


def serve_main(name: str, cpu: int | None, profile: tuple[str, str] | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    rpc.loops.run(_serve(name, Profile(*profile, name, "server") if profile else None))


# --- clients (run here) ---------------------------------------------------------------------


async def _connect(name: str, port: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """Connect row ``name``'s client; return (one echo request, async close)."""
    if name in ("peerwire-chatter", "peerwire-gotalk", "peerwire-gotalk-async"):
        url = (
            f"tcp+sbs://{HOST}:{port}?dialect=HatChatter"
            if name == "peerwire-chatter"
            else f"tcp+gotalk://{HOST}:{port}"
        )
        peer = await rpc.connect(url, registry=rpc.Registry())
        request = peer.request

        def call() -> Awaitable[bytes]:
            return request("echo", PAYLOAD, raw=True)

        return call, peer.close
    if name == "peerwire-gotalk-one":
        url = f"tcp+gotalk://{HOST}:{port}"
        one = await rpc.connect(url, registry=rpc.Registry(), reconnect=False)
        one_request = one.request

        def call_one() -> Awaitable[bytes]:
            return one_request("echo", PAYLOAD, raw=True)

        return call_one, one.close
    if name == "peerwire-gotalk-mw":
        url = f"tcp+gotalk://{HOST}:{port}"
        peer = await rpc.connect(url, registry=rpc.Registry(), middleware=[_pass_through])
        request = peer.request

        def call() -> Awaitable[bytes]:
            return request("echo", PAYLOAD, raw=True)

        return call, peer.close
    if name == "hat-chatter":
        return await _hat_client(port)
    if name == MINIMAL:
        loop = asyncio.get_running_loop()
        minimal_transport, minimal = await loop.create_connection(MinimalGotalkClient, HOST, port)
        minimal_request = minimal.request

        async def minimal_close() -> None:
            minimal_transport.close()

        return (lambda: minimal_request(b"echo", PAYLOAD)), minimal_close
    if name == "bare-echo":
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(BareEchoClient, HOST, port)

        async def close() -> None:
            transport.close()

        return (lambda: protocol.request(PAYLOAD)), close
    raise SystemExit(f"unknown row {name!r}; choose from {', '.join(ROWS)}")


async def _hat_client(port: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    from hat.drivers import chatter, net

    conn = await chatter.connect(net.TcpAddress(HOST, port))
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[bytes]] = {}
    early: dict[int, bytes] = {}  # replies that beat their waiter's registration

    async def receive_loop() -> None:
        try:
            while True:
                msg = await conn.receive()
                future = waiting.pop(msg.conv.first_id, None)
                if future is None:
                    early[msg.conv.first_id] = msg.data.data
                elif not future.done():
                    future.set_result(msg.data.data)
        except ConnectionError:
            pass

    receiver = loop.create_task(receive_loop())

    async def call() -> bytes:
        conv = await conn.send(chatter.Data("Req", PAYLOAD), last=False)
        if conv.first_id in early:
            return early.pop(conv.first_id)
        future = loop.create_future()
        waiting[conv.first_id] = future
        return await future

    async def close() -> None:
        await conn.async_close()
        receiver.cancel()

    return call, close


async def run_row(
    name: str, server: ServerProcess, seconds: float, profile: tuple[str, str] | None
) -> dict[str, Sample]:
    results = {}
    for mode, inflight in MODES:
        if profile and inflight == 1:
            continue
        call, close = await _connect(name, server.port)
        try:
            client_profile = Profile(*profile, name, "client") if profile else None
            results[mode] = await measure(call, inflight, seconds, server, client_profile)
        finally:
            await close()
    return results


def bench_row(
    name: str, seconds: float, cpus: tuple[int, int] | None, profile: tuple[str, str] | None
) -> dict[str, Sample]:
    """Start the server process for ``name``, measure every mode, stop the server."""
    server = ServerProcess(name, __file__, cpus[1] if cpus else None, profile)
    try:
        return rpc.loops.run(run_row(name, server, seconds, profile))
    finally:
        server.close()


# --- report ------------------------------------------------------------------------------


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:4.2f}" if value and base else " n/a"


def report(figures: dict[str, dict[str, dict[str, float]]], rounds: int) -> None:
    """Print :func:`summary`'s figures, each row's share of the bare echo and the ratios."""
    rate = {
        (name, mode): row["rate"] for name, modes in figures.items() for mode, row in modes.items()
    }
    print()
    print(
        f"rate: median of {rounds} round(s); range: slowest..fastest round; "
        "CPU: median microseconds of process CPU per request"
    )
    print(
        f"{'row':<23}{'mode':<13}{'rate':>11}{'':21}  {'range':^20}"
        f"  {'client CPU':>10}  {'server CPU':>10}"
    )
    for name, modes in figures.items():
        for mode, row in modes.items():
            median, low, high = row["rate"], row["low"], row["high"]
            client, server = row["client_us"], row["server_us"]
            print(
                f"{name:<23}{mode:<13}{median:>9,.0f}/s"
                f"  ({_ratio(median, rate.get(('bare-echo', mode)))} of bare echo)"
                f"  {low:>9,.0f}..{high:<9,.0f}  {client:>7.1f} us  {server:>7.1f} us"
            )
    print()
    print("ratios (medians, measured in this run):")
    for mode, _ in MODES:
        chatter = rate.get(("peerwire-chatter", mode))
        print(
            f"  peerwire-chatter {mode:<12} vs hat-chatter: "
            f"{_ratio(chatter, rate.get(('hat-chatter', mode))):>5}   vs bare echo: "
            f"{_ratio(chatter, rate.get(('bare-echo', mode))):>5}"
        )
    for mode, _ in MODES:
        gotalk = rate.get(("peerwire-gotalk", mode))
        print(
            f"  peerwire-gotalk  {mode:<12} vs bare echo: "
            f"{_ratio(gotalk, rate.get(('bare-echo', mode))):>5}"
        )
    for mode, _ in MODES:
        minimal = rate.get((MINIMAL, mode))
        print(
            f"  {MINIMAL} {mode:<12} vs bare echo: "
            f"{_ratio(minimal, rate.get(('bare-echo', mode))):>5}   peerwire-gotalk vs it: "
            f"{_ratio(rate.get(('peerwire-gotalk', mode)), minimal):>5}"
        )
    for mode, _ in MODES:
        coro = rate.get(("peerwire-gotalk-async", mode))
        print(
            f"  peerwire-gotalk-async {mode:<7} vs peerwire-gotalk: "
            f"{_ratio(coro, rate.get(('peerwire-gotalk', mode))):>5}"
        )
    for mode, _ in MODES:
        reconnecting = rate.get(("peerwire-gotalk", mode))
        print(
            f"  peerwire-gotalk  {mode:<12} vs peerwire-gotalk-one: "
            f"{_ratio(reconnecting, rate.get(('peerwire-gotalk-one', mode))):>5}"
        )
    for mode, _ in MODES:
        with_mw = rate.get(("peerwire-gotalk-mw", mode))
        print(
            f"  peerwire-gotalk-mw {mode:<10} vs peerwire-gotalk: "
            f"{_ratio(with_mw, rate.get(('peerwire-gotalk', mode))):>5}"
        )
    print()
    print("reference figures (measured apart, not here; other runs, 2-core machine):")
    for what, figure, source in NOTES:
        print(f"  {what:<50}{figure:>11}  ({source})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timed window per mode")
    parser.add_argument("--only", choices=ROWS, action="append", help="run this row (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="repeat every row; report medians")
    parser.add_argument("--pin", action="store_true", help="client on CPU 0, servers on CPU 1")
    parser.add_argument("--smoke", action="store_true", help="--seconds 0.2 --rounds 1 (CI)")
    parser.add_argument("--profile", metavar="DIR", help="profile both sides, inflight100 only")
    parser.add_argument("--profiler", choices=("cprofile", "pyinstrument"), default="cprofile")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of both sides, every row (default asyncio)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--serve", choices=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ[rpc.loops.ENV_VAR] = args.loop  # read by rpc.loops.run here and in servers
    profile = (args.profiler, args.profile) if args.profile else None
    if args.serve:
        serve_main(args.serve, args.cpu, profile)
        return
    cpus = (0, 1) if args.pin else None
    if cpus:
        os.sched_setaffinity(0, {cpus[0]})
    if args.smoke:
        args.seconds, args.rounds = 0.2, 1
    rounds = 1 if args.profile else max(1, args.rounds)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[Sample]]] = {}
    print(f"event loop: {args.loop} (client and servers)", flush=True)
    for round_no in range(1, rounds + 1):
        for name in args.only or ROWS:
            samples = bench_row(name, args.seconds, cpus, profile)
            for mode, sample in samples.items():
                results.setdefault(name, {}).setdefault(mode, []).append(sample)
            line = ", ".join(
                f"{mode} {s.rate:,.0f}/s ({s.client_us:.1f}+{s.server_us:.1f} us)"
                for mode, s in samples.items()
            )
            print(f"round {round_no}  {name:<21} {line}", flush=True)
    figures = summary(results)
    report(figures, rounds)
    if args.json:
        run = {"loop": args.loop, "rounds": rounds, "seconds": args.seconds, "rows": figures}
        Path(args.json).write_text(json.dumps(run, indent=1))


def summary(results: dict[str, dict[str, list[Sample]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per row and mode: the median rate, its slowest and fastest round, and the median CPU
    microseconds per request of each side (what :func:`report` prints)."""
    return {
        name: {
            mode: {
                "rate": statistics.median(s.rate for s in samples),
                "low": min(s.rate for s in samples),
                "high": max(s.rate for s in samples),
                "client_us": statistics.median(s.client_us for s in samples),
                "server_us": statistics.median(s.server_us for s in samples),
            }
            for mode, samples in modes.items()
        }
        for name, modes in results.items()
    }


if __name__ == "__main__":
    main()

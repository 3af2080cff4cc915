"""What hostile and idle peers cost a server: ``python tests/benchmarks/bench_limits.py``.

Not collected by pytest. The server is a child process (the soak's, ``soak.py --serve``:
``tcp+gotalk``, ``tcp+sbs``, ``ssl+gotalk``, ``ws+gotalk`` with their defaults); its RSS and
CPU are read from /proc; clients and attackers run in this process. Rows (``--only NAME``):

- ``idle``: ``--idle-connections`` (default 10,000: half ``tcp+gotalk``, half ``tcp+sbs``,
  real peerwire clients with default heartbeats and pings, each after one request) stay
  connected; the server's
  CPU over a ``--window`` (default 60 s, which spans Gotalk heartbeats every 20 s and
  Chatter pings after 30 s of silence), and its RSS per connection. These clients share
  one process and coarse timers, so their heartbeats reach the server in batches;
- ``idle-spread``: the same count of connections from plain codec clients that beat on
  their own plan, each at a random phase, as clients on many hosts would: a Gotalk
  heartbeat every 20 s, a Chatter Ping every 20 s (Hat's legacy clients do so; our
  codec answers the server's Pings). Each wakes on its own timer;
- ``non-reader``: one Gotalk peer asks for 600 results of 1 MiB and never reads (its
  receive buffer set to 4 KiB); the server's peak RSS over 10 s (2 s in ``--smoke``), against
  its RSS before;
- ``tls-pending``: a server with ``max_connections=100`` gets 1,000 TCP connections to its
  TLS port that never send a byte: connections held (at most 100), refused, RSS; then how
  long until a real TLS client gets in (the handshake limit, 10 s, frees the slots).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
from rpc import loops
from tests.benchmarks.soak import HOST, ServerChild, machine, raise_nofile
from transports.stream import client_ssl_context
from wire import gotalk
from wire.chatter import ChatterConnection, Dialect

ROWS = ("idle", "idle-spread", "non-reader", "tls-pending")
SPREAD_BEAT = 20.0
"""Seconds between the ``idle-spread`` clients' heartbeats or Pings."""


async def settle(srv: ServerChild, seconds: float = 2.0) -> float:
    """The server's RSS once it has been quiet for ``seconds`` (a measuring pause)."""
    await asyncio.sleep(seconds)
    return srv.rss_mb()


async def idle_cpu(srv: ServerChild, window: float) -> tuple[float, int]:
    """The server's CPU (% of one core) over ``window`` s, and its Gotalk and Chatter
    connections after it."""
    cpu0, t0 = srv.cpu_seconds(), time.monotonic()
    await asyncio.sleep(window)  # the measuring window
    cpu1, t1 = srv.cpu_seconds(), time.monotonic()
    stats = await srv.stats()
    held = stats["tcp+gotalk"]["peers"] + stats["tcp+sbs"]["peers"]
    return 100 * (cpu1 - cpu0) / (t1 - t0), held


async def idle(count: int, window: float) -> None:
    with tempfile.TemporaryDirectory() as pki_dir:
        srv = await ServerChild.start(pki_dir=pki_dir)
        try:
            before = await settle(srv)
            gate = asyncio.Semaphore(100)
            started = time.monotonic()

            async def one(url: str) -> rpc.Peer:
                async with gate:
                    peer = await rpc.connect(
                        url, registry=rpc.Registry(), connect_timeout=60, reconnect=False
                    )
                    # one request: a legacy Chatter client sends nothing before its first,
                    # and a server closes a connection silent past its handshake limit
                    await peer.request("echo", b"hi", raw=True, timeout=60)
                    return peer

            urls = [srv.urls["tcp+gotalk"], srv.urls["tcp+sbs"]]
            peers = await asyncio.gather(*(one(urls[i % 2]) for i in range(count)))
            took = time.monotonic() - started
            after = await settle(srv)
            cpu, held = await idle_cpu(srv, window)
            alive = sum(p.is_open for p in peers)
            print(
                f"idle: {count} connections (opened in {took:.1f} s; after the window {alive} "
                f"open here, {held} on the server); server RSS {before:.1f} -> "
                f"{after:.1f} MB ({(after - before) * 1024 / count:.1f} KiB each); server CPU "
                f"over {window:.0f} s: {cpu:.2f}% of one core"
            )
            for peer in peers:
                peer.abort()
        finally:
            await srv.stop()


class SpreadClient(asyncio.Protocol):
    """One ``idle-spread`` connection: a codec, a random phase, a beat every 20 s."""

    def __init__(self, chatter: bool) -> None:
        self.chatter = ChatterConnection(Dialect.CURRENT) if chatter else None
        self.gotalk = None if chatter else gotalk.GotalkConnection()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.gotalk is not None:
            transport.write(self.gotalk.handshake())  # type: ignore[attr-defined]
        else:  # a first Ping fixes the dialect; the beats start at a random phase
            self.chatter.send_ping()  # type: ignore[union-attr]
            transport.write(self.chatter.data_to_send())  # type: ignore[union-attr,attr-defined]
        loop = asyncio.get_running_loop()
        loop.call_later(random.uniform(0, SPREAD_BEAT), self.beat)

    def beat(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.chatter is not None:
            self.chatter.send_ping()
            self.transport.write(self.chatter.data_to_send())
        else:
            beat = gotalk.Heartbeat(0, int(time.time()) & 0xFFFFFFFF)
            self.transport.write(gotalk.encode(beat))
        asyncio.get_running_loop().call_later(SPREAD_BEAT, self.beat)

    def data_received(self, data: bytes) -> None:
        if self.chatter is not None:
            self.chatter.receive_data(data)  # Pongs for the server's Pings
            if pongs := self.chatter.data_to_send():
                self.transport.write(pongs)  # type: ignore[union-attr]
        else:
            self.gotalk.receive_data(data)  # type: ignore[union-attr]


async def idle_spread(count: int, window: float) -> None:
    with tempfile.TemporaryDirectory() as pki_dir:
        srv = await ServerChild.start(pki_dir=pki_dir)
        try:
            before = await settle(srv)
            loop = asyncio.get_running_loop()
            ports = [srv.port("tcp+gotalk"), srv.port("tcp+sbs")]
            clients = []
            for i in range(count):
                transport, _ = await loop.create_connection(
                    lambda chatter=bool(i % 2): SpreadClient(chatter), HOST, ports[i % 2]
                )
                clients.append(transport)
            after = await settle(srv, min(SPREAD_BEAT, window))  # each beat once (full runs)
            cpu, held = await idle_cpu(srv, window)
            print(
                f"idle-spread: {count} connections of plain codec clients beating every "
                f"{SPREAD_BEAT:.0f} s at random phases ({held} on the server after the window); "
                f"server RSS {before:.1f} -> {after:.1f} MB; server CPU over {window:.0f} s: "
                f"{cpu:.2f}% of one core"
            )
            for transport in clients:
                transport.abort()
        finally:
            await srv.stop()


async def non_reader(samples: int = 40) -> None:
    with tempfile.TemporaryDirectory() as pki_dir:
        srv = await ServerChild.start(pki_dir=pki_dir)
        try:
            before = await settle(srv)
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, srv.port("tcp+gotalk")))
            asks = b"".join(
                gotalk.encode(gotalk.Request(i.to_bytes(4, "big"), "big", b"1048576"))
                for i in range(600)
            )
            await loop.sock_sendall(sock, b"01" + asks)
            peak = before
            for _ in range(samples):  # sample the server's RSS (10 s; the smoke run 2 s)
                await asyncio.sleep(0.25)
                peak = max(peak, srv.rss_mb())
            async with rpc.connect(srv.urls["tcp+gotalk"], registry=rpc.Registry()) as canary:
                t0 = time.perf_counter()
                await canary.request("echo", b"x", raw=True)
                answer_ms = (time.perf_counter() - t0) * 1000
            print(
                f"non-reader: 600 requests for 1 MiB results, never read: server RSS "
                f"{before:.1f} MB, peak {peak:.1f} MB (+{peak - before:.1f} MB); a canary "
                f"meanwhile answered in {answer_ms:.2f} ms"
            )
            sock.close()
        finally:
            await srv.stop()


async def tls_pending() -> None:
    with tempfile.TemporaryDirectory() as pki_dir:
        srv = await ServerChild.start("--tls-max-connections", "100", pki_dir=pki_dir)
        try:
            before = await settle(srv)
            port = srv.port("ssl+gotalk")
            silent = [await asyncio.open_connection(HOST, port) for _ in range(1000)]
            opened = time.monotonic()
            await asyncio.sleep(1.0)  # let the server accept them all
            stats = (await srv.stats())["ssl+gotalk"]
            rss = srv.rss_mb()
            ctx = client_ssl_context(cafile=srv.ca)
            while True:  # a real client gets in once the handshake limit frees the slots
                try:
                    async with rpc.connect(srv.urls["ssl+gotalk"], ssl=ctx) as client:
                        await client.request("echo", b"in", raw=True)
                    break
                except rpc.ConnectionClosed:
                    await asyncio.sleep(0.5)
            waited = time.monotonic() - opened
            print(
                f"tls-pending: 1000 silent connections to a TLS port, max_connections=100: "
                f"{stats['peers']} held, {stats['refused']} refused; server RSS {before:.1f} "
                f"-> {rss:.1f} MB (+{rss - before:.1f} MB); a real client got in after "
                f"{waited:.1f} s"
            )
            for _, writer in silent:
                writer.close()
        finally:
            await srv.stop()


async def main(only: list[str], count: int, window: float) -> None:
    raise_nofile(count + 1000)
    print(machine())
    if "idle" in only:
        await idle(count, window)
    if "idle-spread" in only:
        await idle_spread(count, window)
    if "non-reader" in only:
        await non_reader(40 if window >= 10 else 8)
    if "tls-pending" in only:
        await tls_pending()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", action="append", choices=ROWS)
    parser.add_argument("--idle-connections", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CI: idle and idle-spread (200 connections, 1 s window) and non-reader only; "
        "tls-pending waits out the 10 s handshake limit, so it is left to full runs",
    )
    args = parser.parse_args()
    if args.smoke:
        loops.run(main(args.only or ["idle", "idle-spread", "non-reader"], 200, 1.0))
    else:
        loops.run(main(args.only or list(ROWS), args.idle_connections, args.window))

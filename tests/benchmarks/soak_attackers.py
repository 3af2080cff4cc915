"""The soak's attackers and well-behaved clients (see ``soak.py``): each a coroutine that
plays one part against a server on 127.0.0.1 until cancelled, counting what it did in a
:class:`Counters`. Not collected by pytest."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

import rpc
from transports.stream import client_ssl_context
from wire import gotalk
from wire.chatter import Dialect, Msg, encode_frame

HOST = "127.0.0.1"


class Target(Protocol):
    """The attacked server: its URL per transport and its CA (the soak's ServerChild)."""

    urls: dict[str, str]

    @property
    def ca(self) -> Path: ...

    def port(self, name: str) -> int: ...


class Counters(dict[str, int]):
    def add(self, key: str, n: int = 1) -> None:
        self[key] = self.get(key, 0) + n


async def forever(
    count: Counters, name: str, attack: Callable[[], Awaitable[None]], pause: float
) -> None:
    """Run one attacker again and again, ``pause`` s apart; a refused or reset connection is
    part of the game."""
    while True:
        try:
            await attack()
        except (OSError, EOFError, TimeoutError, rpc.RpcError, ssl.SSLError):
            count.add(f"{name} errors")
        count.add(name)
        await asyncio.sleep(pause)


async def until_closed(reader: asyncio.StreamReader, limit: float) -> None:
    async with asyncio.timeout(limit):
        while await reader.read(65536):
            pass


def slowloris_prefix(transport: str, port: int) -> bytes:
    if transport == "tcp+gotalk":
        return b"0"  # one of the two version digits
    if transport == "tcp+sbs":
        return encode_frame(Msg(1, 1, True, True, True, "X", b"y" * 64), Dialect.CURRENT)[:-1]
    if transport == "ws+gotalk":
        return f"GET /gotalk/ HTTP/1.1\r\nHost: {HOST}:{port}\r\n".encode()
    return bytes.fromhex("160301020001") + bytes(60)  # the start of a TLS ClientHello


async def slowloris(transport: str, port: int) -> None:
    """Trickle one byte every 2 s of a never-finished handshake until the server closes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        for byte in slowloris_prefix(transport, port):
            writer.write(bytes([byte]))
            try:
                async with asyncio.timeout(2):
                    if not await reader.read(65536):
                        return
            except TimeoutError:
                continue
        await until_closed(reader, 60)
    finally:
        writer.close()


async def silent(port: int) -> None:
    """A TCP connection that never sends: the server's handshake limit closes it."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        await until_closed(reader, 60)
    finally:
        writer.close()


async def non_reader(port: int, hold: float) -> None:
    """Ask for 64 x 256 KiB and never read; give up after ``hold`` s."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, (HOST, port))
        asks = (
            gotalk.encode(gotalk.Request(i.to_bytes(4, "big"), "big", b"262144")) for i in range(64)
        )
        await loop.sock_sendall(sock, b"01" + b"".join(asks))
        await asyncio.sleep(hold)  # the attack itself: hold the connection, read nothing
    finally:
        sock.close()


async def garbage(transport: str, port: int) -> None:
    """A valid handshake, then random bytes; read until the server closes."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        hello = b"01" if transport == "tcp+gotalk" else b""
        writer.write(hello + random.randbytes(256))
        await until_closed(reader, 30)
    finally:
        writer.close()


async def refused_flood(url: str, count: Counters, name: str) -> None:
    async with rpc.connect(url, registry=rpc.Registry()) as peer:
        while True:
            asks = [peer.request("nope", 1, timeout=10) for _ in range(100)]
            for result in await asyncio.gather(*asks, return_exceptions=True):
                if isinstance(result, rpc.RemoteError):
                    count.add(name)
            await asyncio.sleep(0.1)


async def normal(url: str, ssl_ctx: ssl.SSLContext | None, count: Counters, name: str) -> None:
    async with rpc.connect(url, registry=rpc.Registry(), ssl=ssl_ctx) as peer:
        while True:
            if await peer.request("echo", b"ok", raw=True, timeout=10) == b"ok":
                count.add(name)
            await asyncio.sleep(0.005)


GROUPS = ("slowloris", "silent-tls", "non-reader", "garbage", "refused", "normal")


def attacks(
    srv: Target, count: Counters, groups: Sequence[str] = GROUPS
) -> list[Callable[[], Awaitable[None]]]:
    """The attackers and normal clients of ``groups``, as coroutine functions to run."""
    jobs: list[Callable[[], Awaitable[None]]] = []

    def job(name: str, attack: Callable[[], Awaitable[None]], pause: float = 0.0) -> None:
        jobs.append(lambda: forever(count, name, attack, pause))

    if "slowloris" in groups:
        for transport in ("tcp+gotalk", "tcp+sbs", "ssl+gotalk", "ws+gotalk"):
            port = srv.port(transport)
            for _ in range(40):
                job(f"slowloris {transport}", lambda t=transport, p=port: slowloris(t, p))
    if "silent-tls" in groups:
        for _ in range(200):
            job("silent TLS", lambda: silent(srv.port("ssl+gotalk")))
    if "non-reader" in groups:
        for _ in range(4):
            job("non-reader", lambda: non_reader(srv.port("tcp+gotalk"), 40))
    if "garbage" in groups:
        for transport in ("tcp+gotalk", "tcp+sbs"):
            for _ in range(10):
                job(f"garbage {transport}", lambda t=transport: garbage(t, srv.port(t)), 1.0)
    if "refused" in groups:
        for transport in ("tcp+gotalk", "tcp+sbs"):
            name = f"refused {transport}"
            job(name + " (conn)", lambda u=srv.urls[transport], n=name: refused_flood(u, count, n))
    if "normal" in groups:
        tls = client_ssl_context(cafile=srv.ca)
        for transport in ("tcp+gotalk", "tcp+sbs", "ssl+gotalk", "ws+gotalk"):
            ctx = tls if transport.startswith("ssl") else None
            name = f"normal {transport}"
            job(
                name + " (conn)",
                lambda u=srv.urls[transport], c=ctx, n=name: normal(u, c, count, n),
            )
    return jobs


async def paced(jobs: list[Callable[[], Awaitable[None]]], spread: float) -> list[asyncio.Task]:
    """Start the jobs spread over ``spread`` s (so reconnects do not all come at once)."""
    tasks = []
    for i, make in enumerate(jobs):
        tasks.append(asyncio.create_task(make()))
        if i % 20 == 19:
            await asyncio.sleep(spread / max(1, len(jobs) / 20))
    return tasks

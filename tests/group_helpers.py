"""Helpers for the group node tests: both event loops, members, raw peers and frames.

``@on_both_loops`` turns an ``async def`` test into one test per event loop (asyncio and
uvloop), each run in a fresh loop of that kind. Fixtures the test asks for are passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import uvloop

import rpc
from rpc.group import GroupNode, GroupOptions, NetID
from rpc.group.payloads import encode_envelope
from tests.rpc_helpers import in_background, wait_until
from wire.gossip import BroadcastID, Gossip, GossipCodec, encode_frame, payload_tag

KEY = b"test group key"

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

wait_for = wait_until
"""The tests' poll-until helper, under the name the group tests use."""


def on_both_loops(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run the coroutine test ``fn`` on asyncio's loop and on uvloop (parameter ``loop``)."""
    signature = inspect.signature(fn)

    @pytest.mark.parametrize("loop", list(LOOPS))
    @functools.wraps(fn)
    def test(loop: str, **fixtures: Any) -> None:
        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            runner.run(fn(**fixtures))

    loop_param = inspect.Parameter("loop", inspect.Parameter.KEYWORD_ONLY, annotation=str)
    test.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[
            *(
                p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                for p in signature.parameters.values()
            ),
            loop_param,
        ]
    )
    del test.__wrapped__  # type: ignore[attr-defined]  # pytest must see the new signature
    return test


@dataclass(frozen=True)
class Point:
    x: int
    y: int


class Member:
    """A node plus everything its handlers received."""

    def __init__(self) -> None:
        self.registry = rpc.Registry()
        self.got: list[tuple[str, Any]] = []
        self.node: GroupNode

        @self.registry.handle_notification("chat")
        def chat(text: str) -> None:
            self.got.append(("chat", text))

        @self.registry.handle_notification("point")
        def point(p: Point) -> None:
            self.got.append(("point", p))

        @self.registry.handle_notification("blob")
        def blob(data: bytes) -> None:
            self.got.append(("blob", data))

        @self.registry.handle_notification("later")
        async def later(value: Any) -> None:
            await asyncio.sleep(0)
            self.got.append(("later", value))

    async def start(self, peers: list[NetID] | None = None, port: int = 0, **kw: Any) -> GroupNode:
        rng = kw.pop("rng", None)
        self.node = await GroupNode.start(
            "127.0.0.1",
            port,
            key=KEY,
            peers=peers or [],
            registry=self.registry,
            options=GroupOptions(**kw),
            rng=rng,
        )
        return self.node


@contextlib.asynccontextmanager
async def group(n: int, **kw: Any) -> AsyncIterator[list[Member]]:
    """``n`` members on 127.0.0.1, each knowing all the others."""
    members = [Member() for _ in range(n)]
    try:
        for m in members:
            await m.start(**kw)
        for m in members:
            for other in members:
                m.node.add_peer(other.node.netid)
        yield members
    finally:
        for m in members:
            if hasattr(m, "node"):
                await m.node.close()


def in_flight(*nodes: GroupNode) -> int:
    """Frames sent by ``nodes`` but not yet received by them (all nodes of a closed group)."""
    return sum(n.stats.frames_sent for n in nodes) - sum(n.stats.frames_received for n in nodes)


class RawPeer:
    """A plain TCP server that decodes what it gets, or misbehaves as asked.

    Modes: ``read`` (decode everything), ``drop`` (close at once), ``stall`` (never read),
    ``drop-first`` (close the first connection after its first frame, then read).
    """

    def __init__(self, mode: str = "read") -> None:
        self.mode = mode
        self.frames: list[Gossip] = []
        self.accepted = 0
        self.server: asyncio.Server
        self._blocked = asyncio.Event()

    async def __aenter__(self) -> RawPeer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._blocked.set()
        self.server.close()

    @property
    def netid(self) -> NetID:
        return NetID("127.0.0.1", self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "drop":
            writer.transport.abort()
            return
        if self.mode == "stall":
            writer.transport.pause_reading()
            await self._blocked.wait()
            writer.transport.abort()
            return
        codec = GossipCodec(KEY)
        first_only = self.mode == "drop-first" and self.accepted == 1
        try:
            while data := await reader.read(65536):
                self.frames.extend(codec.receive_data(data))
                if first_only and self.frames:
                    writer.transport.abort()
                    return
        finally:
            writer.close()  # the peer closed (or its loop is going): ours too, not to the GC


async def send_raw(netid: NetID, *frames: bytes) -> None:
    """Write frames on a fresh connection and close it."""
    _, writer = await asyncio.open_connection(netid.host, netid.port)
    writer.write(b"".join(frames))
    await writer.drain()
    writer.close()


async def closed_on(netid: NetID, data: bytes, timeout: float = 2.0) -> bool:
    """Write ``data``; True once the node closes the connection on us."""
    reader, writer = await asyncio.open_connection(netid.host, netid.port)
    writer.write(data)
    try:
        async with asyncio.timeout(timeout):
            return await reader.read(1) == b""
    finally:
        writer.close()


def frame(
    sender: NetID, origin: NetID, seq: int, name: str, value: Any, dist: tuple[NetID, ...] = ()
) -> bytes:
    """A well-formed gossip frame carrying our envelope for ``value``."""
    payload = encode_envelope(origin, seq, value)
    gossip = Gossip(
        BroadcastID(sender, 1), distribution=dist, tag=payload_tag(name), payload=payload
    )
    return encode_frame(gossip, KEY)


def raw_payload_frame(sender: NetID, name: str, payload: bytes) -> bytes:
    """A well-formed gossip frame whose payload is ``payload`` as given."""
    return encode_frame(Gossip(BroadcastID(sender, 1), tag=payload_tag(name), payload=payload), KEY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def sampling(sample: Callable[[], None]) -> AsyncIterator[None]:
    """Call ``sample()`` at every turn of the loop while the block runs: for peaks of
    state that no event announces (queues, footprints)."""

    async def run() -> None:
        while True:
            sample()
            await asyncio.sleep(0)

    async with in_background(run()):
        yield

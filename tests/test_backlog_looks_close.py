"""During a graceful close (a peer without retry results, our output waiting) the parts of
a stream whose handler does not run (turned away by the close, ended lately, forgotten)
are dropped as they are read, not kept: kept, they would fill the backlog behind the slots
and stop the reading of what the close waits for. Those kept before the close (read while
our output waited) go at the look its start asks, over every kept message; those of a
stream that runs during the close and ends go as they reach the front. No look is asked
per read, nor per stream served. Reviews 210, 211 and 213-217 each found a way a part
stayed kept, or a look per read or per stream, in the rounds before (the stop's note).
Real sockets on 127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc.backlog import Backlog
from rpc.peer import Peer
from rpc.served_streams import ENDED_STREAMS
from tests.rpc_helpers import gotalk_connection, wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops

KEPT = 2000
READS = 20
PER_READ = 100
STREAMS = 1500


def _rid(i: int) -> bytes:
    return i.to_bytes(4, "big")


def _registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("big")
    def big(value: Any) -> Any:
        return "x" * (8 << 20)  # far above high_water and what the sockets buffer

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    @reg.handle_stream("early")
    async def early(values: Any) -> int:
        return 0  # answers without reading its parts: the stream ends early (_ended)

    @reg.handle_stream("total")
    async def total(values: Any) -> int:
        return sum([value async for value in values])

    return reg


@pytest.fixture
def looked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The messages the backlogs' looks go over (``Backlog.run_replies``, the real one,
    counted): ``looked[0]``."""
    count = [0]
    real = Backlog.run_replies

    def counted(self: Backlog, *args: Any) -> int:
        count[0] += len(self.messages) if self.unlooked < 0 else self.unlooked
        return real(self, *args)

    monkeypatch.setattr(Backlog, "run_replies", counted)
    return count


class Scene:
    """A server's connection (Gotalk over TCP, no retry results) and the raw client that
    feeds it; ``close`` begins the server's graceful close, cancelled at the scene's end."""

    def __init__(self, served: Peer, writer: asyncio.StreamWriter) -> None:
        self.served = served
        self.writer = writer
        self.kept = served._kept
        self.closing: asyncio.Future[None] | None = None

    def send(self, *messages: Any) -> None:
        self.writer.write(b"".join(encode(message) for message in messages))

    async def close(self, drain_timeout: float) -> None:
        self.closing = asyncio.ensure_future(self.served.close(drain_timeout=drain_timeout))
        await wait_until(lambda: self.served.gave_up is not None, 2)


@contextlib.asynccontextmanager
async def _output_waits(
    registry: rpc.Registry | None = None, first: Any = None, ready: str = ""
) -> AsyncIterator[Scene]:
    """The scene with our output waiting: the client sent the handshake, ``first`` (then
    waited until its stream is in ``_ended`` or ``_streams``, as ``ready`` says), and a
    request whose 8-MiB result it does not read."""
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=registry or _registry(), retry_results=False
    ) as server:
        scene: Scene | None = None
        async with gotalk_connection(server.url.port) as (_reader, writer):
            try:
                if first is not None:
                    writer.write(encode(first))
                    await wait_until(lambda: bool(server.peers), 5)
                    [served] = server.peers
                    await wait_until(lambda: first.id in getattr(served, ready), 5)
                writer.write(encode(Request(_rid(1), "big", b"0")))
                await wait_until(lambda: any(p.outbox.blocked for p in server.peers), 5)
                [served] = server.peers
                scene = Scene(served, writer)
                yield scene
            finally:
                if scene is not None and scene.closing is not None:
                    scene.closing.cancel()


async def test_a_part_of_a_stream_the_close_turns_away_is_dropped_as_read() -> None:
    """Stream request 10, turned away, and its part, in one read and past a turn's worth
    of turned-away requests (the rest of that read kept whole, then looked over)."""
    async with _output_waits() as scene:
        scene.send(Request(_rid(2), "work", b"2"))
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        await scene.close(drain_timeout=4.0)
        scene.send(StreamRequest(_rid(10), "total", b"0"), StreamRequestPart(_rid(10), b"1"))
        await wait_until(lambda: _rid(10) in scene.served._ended, 5)
        assert len(scene.kept.messages) == 1  # request 2 alone: the part went as read
        turned = [Request(_rid(i), "work", b"0") for i in range(1000, 1299)]
        late = [StreamRequest(_rid(11), "total", b"0"), StreamRequestPart(_rid(11), b"1")]
        scene.send(*turned, *late)
        await wait_until(lambda: _rid(11) in scene.served._ended and scene.kept.sorted, 5)
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)
        assert scene.served.outbox.blocked


@pytest.mark.parametrize("with_parts", [False, True])
async def test_turned_away_streams_ask_no_whole_look_per_read(
    looked: list[int], with_parts: bool
) -> None:
    """Turned-away stream requests (each with a part, or not) 100 per read, past
    ``ENDED_STREAMS``, with 2,000 requests kept from before the close: a look per message
    read, not one over the whole backlog per read (7,990 kept, 3 s of such reads cost 713
    looks and 2.3 s of CPU when forgetting a stream asked a look: reviews 213 and 216)."""
    async with _output_waits() as scene:
        scene.send(*(Request(_rid(i), "work", b"0") for i in range(2, 2 + KEPT)))
        await wait_until(lambda: len(scene.kept.messages) == KEPT and scene.served.reading, 5)
        await scene.close(drain_timeout=10.0)
        looked[0] = 0
        first = 100_000
        for n in range(READS):  # turned away as read; past ENDED_STREAMS each forgets one
            ids = range(first + n * PER_READ, first + (n + 1) * PER_READ)
            sent: list[Any] = []
            for i in ids:
                sent.append(StreamRequest(_rid(i), "total", b"0"))
                if with_parts:
                    sent.append(StreamRequestPart(_rid(i), b"1"))
            scene.send(*sent)
            last = _rid(ids[-1])
            await wait_until(
                lambda: last in scene.served._ended and scene.served.reading,  # noqa: B023
                5,
            )
        assert READS * PER_READ > 2 * ENDED_STREAMS
        assert len(scene.kept.messages) == KEPT  # the requests read before the close wait
        # a look per message read is fine; one over the whole backlog per read is not
        assert looked[0] <= 2 * KEPT + 2 * READS * PER_READ, looked[0]


async def test_a_part_kept_before_the_close_goes_at_its_start() -> None:
    """A stream ended early (its handler answered without its parts), then its part kept
    while our output waits, before the close: the close's start looks again and drops it
    (review 214 of 60a419c: it stayed kept until its stream was forgotten, or for good)."""
    early = StreamRequest(_rid(10), "early", b"0")
    async with _output_waits(first=early, ready="_ended") as scene:
        scene.send(Request(_rid(2), "big", b"2"))  # kept first: waits
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        scene.send(StreamRequestPart(_rid(10), b"1"))  # kept: output waits
        await wait_until(lambda: len(scene.kept.messages) == 2 and scene.served.reading, 5)
        await scene.close(drain_timeout=8.0)
        # the part goes, request 2 (read before the close) waits for our output
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)
        assert scene.served.outbox.blocked


async def test_kept_stream_requests_run_in_a_close_ask_no_whole_look_each(
    looked: list[int],
) -> None:
    """One slot held by a request, ``STREAMS`` (1,500) stream requests (no parts) kept
    behind it, then the close begins and the slot frees: each runs and ends in turn. A look per
    message is fine; one over the whole backlog per stream served is not (review 217 of
    0afc1cb: a look at each such end, 1,122,751 messages looked over; 4,000 kept: 5.5 s)."""
    go = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await go.wait()
        return value

    @reg.handle_stream("early")
    async def early(values: Any) -> int:
        return 0  # answers without reading its parts (none come)

    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=reg, options=options, retry_results=False
    ) as server:
        closing: asyncio.Future[None] | None = None
        async with gotalk_connection(server.url.port) as (_reader, writer):
            try:
                requests = [StreamRequest(_rid(i), "early", b"0") for i in range(10, 10 + STREAMS)]
                writer.write(
                    b"".join(encode(m) for m in [Request(_rid(1), "hold", b"0"), *requests])
                )
                await wait_until(lambda: bool(server.peers), 5)
                [served] = server.peers
                await wait_until(lambda: len(served._kept.messages) == STREAMS, 5)  # read before
                closing = asyncio.ensure_future(served.close(drain_timeout=60.0))
                await wait_until(lambda: served.gave_up is not None, 2)
                looked[0] = 0
                go.set()  # the slot frees: the kept stream requests run, one at a time
                await wait_until(
                    lambda: not served._kept.messages and not served.handlers_running, 20
                )
                assert len(served._ended) == min(STREAMS, 256)  # (they ran and ended)
                assert looked[0] <= 4 * STREAMS, looked[0]
            finally:
                if closing is not None:
                    closing.cancel()

"""A graceful close (a peer without retry results) drops the kept part of a stream it
turned away once it forgets that stream past ``ENDED_STREAMS`` (``InputFlow._runs_now``),
while our output waits: forgetting it asks a look over the whole backlog at the next turn
(``ServedStreams._end_stream``), however the later requests were read: in reads cut at a
turn's 256 messages (kept whole in part, looked over: before 2e32e5d the look went over
the newest alone, review 210) or a few at a time, all run at once (no look came at all,
review 211, before and after 8b4f796); and so is one kept before the close or while its
stream ran (review 214), also when its id is used again (review 215). Forgetting a stream
none of whose parts is kept asks no look.
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
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops

KEPT = 2000
READS = 20
PER_READ = 100


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

    async def forget(self, stream: bytes, per_read: int | None = None) -> None:
        """Stream requests the close turns away as read, past ``ENDED_STREAMS``: ``stream``
        is forgotten; in one read, or ``per_read`` at a time, each read waited for."""
        ids = list(range(100, 100 + ENDED_STREAMS + 44))
        step = per_read or len(ids)
        for start in range(0, len(ids), step):
            self.send(*(StreamRequest(_rid(i), "total", b"0") for i in ids[start : start + step]))
            last = _rid(ids[min(start + step, len(ids)) - 1])
            await wait_until(lambda: last in self.served._ended, 5)  # noqa: B023
        assert stream not in self.served._ended  # forgotten: its part runs now (dropped)
        assert self.served.outbox.blocked  # (nothing rechecked the backlog for our output)


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
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        scene: Scene | None = None
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
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
            writer.close()
            if scene is not None and scene.closing is not None:
                scene.closing.cancel()


@contextlib.asynccontextmanager
async def _part_kept_in_close() -> AsyncIterator[Scene]:
    """With request 2 kept (read before the close), the close begun, and stream request 10
    turned away (remembered in ``_ended``) whose part, read with it, is kept behind request
    2: ``_runs_now`` is False for it (its stream is "served" and the output waits)."""
    async with _output_waits() as scene:
        scene.send(Request(_rid(2), "work", b"2"))
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        await scene.close(drain_timeout=4.0)
        scene.send(StreamRequest(_rid(10), "total", b"0"), StreamRequestPart(_rid(10), b"1"))
        await wait_until(lambda: len(scene.kept.messages) == 2, 5)
        assert _rid(10) in scene.served._ended  # turned away, remembered: its part is kept
        yield scene


async def test_the_part_is_dropped_after_a_read_past_a_turn() -> None:
    """A read past a turn's worth of turned-away requests is looked over (the part too,
    which does not run now); then 300 stream requests in one read forget stream 10, and
    the part goes."""
    async with _part_kept_in_close() as scene:
        turned = [Request(_rid(i), "work", b"0") for i in range(1000, 1299)]
        scene.send(*turned, StreamRequest(_rid(5000), "total", b"0"))
        await wait_until(lambda: _rid(5000) in scene.served._ended and scene.kept.sorted, 5)
        assert len(scene.kept.messages) == 2
        await scene.forget(_rid(10))
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)  # request 2 alone


async def test_the_part_is_dropped_after_reads_that_all_run() -> None:
    """Stream requests read 50 at a time, each read turned away whole at once: no read is
    kept, so only forgetting stream 10 asks the look that drops its part."""
    async with _part_kept_in_close() as scene:
        await scene.forget(_rid(10), per_read=50)
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)  # request 2 alone


async def test_forgetting_streams_with_no_kept_part_asks_no_whole_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Turned-away stream requests a few per read, past ``ENDED_STREAMS``, with 2,000
    requests kept from before the close and none of the forgotten streams' parts: a look
    per message read, not one over the whole backlog per read (review 213 of e035c06:
    7,990 kept, 3 s of such reads cost 713 looks, 2.3 s of CPU)."""
    looked = [0]
    real = Backlog.run_replies

    def counted(self: Backlog, *args: Any) -> int:  # the real look, counted
        looked[0] += len(self.messages) if self.unlooked < 0 else self.unlooked
        return real(self, *args)

    monkeypatch.setattr(Backlog, "run_replies", counted)
    async with _output_waits() as scene:
        scene.send(*(Request(_rid(i), "work", b"0") for i in range(2, 2 + KEPT)))
        await wait_until(lambda: len(scene.kept.messages) == KEPT and scene.served.reading, 5)
        await scene.close(drain_timeout=10.0)
        looked[0] = 0
        first = 100_000
        for n in range(READS):  # turned away as read; past ENDED_STREAMS each forgets one
            ids = range(first + n * PER_READ, first + (n + 1) * PER_READ)
            scene.send(*(StreamRequest(_rid(i), "total", b"0") for i in ids))
            last = _rid(ids[-1])
            await wait_until(lambda: last in scene.served._ended and scene.served.reading, 5)  # noqa: B023
        assert READS * PER_READ > 2 * ENDED_STREAMS
        assert len(scene.kept.messages) == KEPT  # the requests read before the close wait
        # a look per message read is fine; one over the whole backlog per read is not
        assert looked[0] <= 2 * KEPT + READS * PER_READ, looked[0]


async def test_a_part_kept_before_the_close_is_dropped_once_its_stream_is_forgotten() -> None:
    """A stream ended early (its handler answered without its parts), then its part kept
    while our output waits, before the close: the close's start marks the streams ended
    before it (review 214 of 60a419c: nothing marked it, and forgetting it asked no look)."""
    early = StreamRequest(_rid(10), "early", b"0")
    async with _output_waits(first=early, ready="_ended") as scene:
        scene.send(Request(_rid(2), "big", b"2"))  # kept first: waits
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        scene.send(StreamRequestPart(_rid(10), b"1"))  # kept: output waits
        await wait_until(lambda: len(scene.kept.messages) == 2 and scene.served.reading, 5)
        await scene.close(drain_timeout=8.0)
        await scene.forget(_rid(10))
        # the part goes, request 2 (read before the close) waits for our output
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)


async def test_a_part_kept_while_its_stream_ran_is_dropped_once_it_is_forgotten() -> None:
    """The same for a part kept during the close while its stream's handler ran
    (``_runs_now`` marks nothing: the stream is not in ``_ended`` yet), the handler
    then answering without it: a stream that ran during the close is marked as it ends
    (review 214 of 60a419c)."""
    go = asyncio.Event()
    reg = _registry()

    @reg.handle_stream("waits")
    async def waits(values: Any) -> int:
        await go.wait()  # answers without reading its parts
        return 0

    running = StreamRequest(_rid(10), "waits", b"0")
    async with _output_waits(reg, first=running, ready="_streams") as scene:
        scene.send(Request(_rid(2), "big", b"2"))  # kept first: waits
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        await scene.close(drain_timeout=8.0)
        scene.send(StreamRequestPart(_rid(10), b"1"))  # kept: output waits
        await wait_until(lambda: len(scene.kept.messages) == 2 and scene.served.reading, 5)
        go.set()
        await wait_until(lambda: _rid(10) in scene.served._ended, 5)  # answered: ended
        await scene.forget(_rid(10))
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)


async def test_a_reused_stream_id_keeps_the_mark_of_its_earlier_stream() -> None:
    """Review 214's first scene, then the peer uses id 10 again for a stream request the
    close turns away (it had our answer: the id is free): ending it keeps the earlier
    stream's mark, so forgetting 10 still drops the part (review 215 of 8fb7467: it was
    set anew, unmarked)."""
    early = StreamRequest(_rid(10), "early", b"0")
    async with _output_waits(first=early, ready="_ended") as scene:
        scene.send(Request(_rid(2), "big", b"2"))  # kept first: waits
        await wait_until(lambda: len(scene.kept.messages) == 1, 5)
        scene.send(StreamRequestPart(_rid(10), b"1"))  # kept: output waits
        await wait_until(lambda: len(scene.kept.messages) == 2 and scene.served.reading, 5)
        await scene.close(drain_timeout=8.0)
        assert scene.served._ended[_rid(10)]  # marked by the close's start
        scene.send(StreamRequest(_rid(10), "total", b"0"))  # id 10 again: turned away
        await scene.forget(_rid(10))
        await wait_until(lambda: len(scene.kept.messages) == 1, 1)

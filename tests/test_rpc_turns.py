"""Turns at held-back input: a read past MESSAGES_PER_TURN is handled over several loop
turns, and reading resumes only once the tasks those turns woke have run.

Over a stand-in transport that records what the peer asks of it (no socket: the order of
loop callbacks is the subject, and a socket's timing would blur it)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import rpc
from rpc.gotalk_peer import GotalkPeer
from rpc.peer import MESSAGES_PER_TURN
from rpc.streaming import PARTS_PER_TURN
from tests.rpc_helpers import wait_until
from wire import gotalk


class RecordingTransport(asyncio.Transport):
    """Keeps nothing it is given; calls ``on_resume`` when the peer resumes reading."""

    def __init__(self) -> None:
        super().__init__()
        self.on_resume: Any = None
        self.paused = 0

    def write(self, data: Any) -> None:
        pass

    def writelines(self, list_of_data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        if self.on_resume is not None:
            self.on_resume()

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def test_reading_resumes_after_the_stream_readers_a_turn_woke() -> None:
    """A read of 2.5 turns' worth of one stream's results: each turn's results reach the
    stream's reader before more are handled, and when reading resumes the reader has
    taken everything (before, reading resumed right after the last turn, with its
    results still queued: on uvloop the next read could come first and overflow the
    stream's queue)."""
    peer = GotalkPeer(rpc.Registry())
    transport = RecordingTransport()
    peer.connection_made(transport)
    try:
        count = MESSAGES_PER_TURN * 5 // 2
        got: list[bytes] = []

        async def reader() -> None:  # takes all that is queued each time it runs
            async for item in peer.stream("count", value=count, raw=True):
                got.append(item)

        reading = asyncio.ensure_future(reader())
        await asyncio.sleep(0)  # the request goes out: its id is the first
        [key] = list(peer._calls)
        queued_at_resume: list[int] = []
        transport.on_resume = lambda: queued_at_resume.append(len(peer._calls[key].queue))
        parts = [gotalk.StreamResult(key, b"%d" % i) for i in range(count)]
        peer.data_received(b"01" + b"".join(gotalk.encode(part) for part in parts))
        await wait_until(lambda: bool(queued_at_resume))
        assert transport.paused == 1
        assert queued_at_resume == [0], queued_at_resume  # [count % MESSAGES_PER_TURN] before
        assert got == [b"%d" % i for i in range(count)]
        peer.data_received(gotalk.encode(gotalk.StreamResult(key, b"")))  # the end
        await asyncio.wait_for(reading, 5)
    finally:
        peer.connection_lost(None)


async def test_a_streamed_result_gives_a_turn_every_256_parts_after_waiting_too() -> None:
    """A generator that never waits yields the loop at least every PARTS_PER_TURN parts,
    also after its output backed up once exactly at that count (the count then stayed past
    the limit and the yields stopped for the rest of the stream)."""
    peer = GotalkPeer(rpc.Registry())
    peer.connection_made(RecordingTransport())
    try:
        produced = 0

        async def parts() -> Any:
            nonlocal produced
            while produced < 5000:
                if produced == PARTS_PER_TURN:  # the output backs up just then, once
                    peer.outbox.pause()
                    asyncio.get_running_loop().call_soon(peer.outbox.resume)
                produced += 1
                yield produced

        seen: list[int] = []
        done = False

        async def ticker() -> None:  # another task: what it sees between its turns
            while not done:
                seen.append(produced)
                await asyncio.sleep(0)

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        await peer._stream_result(b"0001", parts())
        done = True
        await ticking
        seen.append(produced)
        longest = max(b - a for a, b in itertools.pairwise(seen))
        assert longest <= PARTS_PER_TURN + 1, longest  # 4,700 or so before
    finally:
        peer.connection_lost(None)

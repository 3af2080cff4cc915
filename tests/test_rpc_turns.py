"""Turns at held-back input: a read past MESSAGES_PER_TURN is handled over several loop
turns, and reading resumes only once the tasks those turns woke have run.

Over a stand-in transport that records what the peer asks of it (no socket: the order of
loop callbacks is the subject, and a socket's timing would blur it)."""

from __future__ import annotations

import asyncio
from typing import Any

import rpc
from rpc.gotalk_peer import GotalkPeer
from rpc.peer import MESSAGES_PER_TURN
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

"""The parts of a running stream while the rest of the peer's input waits: they keep their
order, and a part refused for room does not keep the loop busy. Each failed on e131a8d
(found in review by helper-93): a part read between two turns at kept parts ran ahead of
them; a refused part re-armed a turn every loop iteration."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import rpc
from tests.gotalk_raw import RawGotalk, served_raw
from tests.rpc_helpers import wait_until
from wire import gotalk


async def test_parts_read_while_kept_parts_drain_do_not_overtake_them() -> None:
    """Parts of a running stream kept while our output waited (other calls' results,
    unread) run once it drains, a turn (256) at a time; a part read meanwhile, between two
    turns, must run after them, not at once."""
    seen: list[int] = []
    started = asyncio.Event()
    done = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> int:
        async for n in parts:
            seen.append(n)
            if len(seen) == 300:  # the kept parts run: the second turn at them
                started.set()
        done.set()
        return len(seen)

    reg.handle("big")(lambda size: b"x" * size)
    options = rpc.Options(high_water=64 * 1024, low_water=16 * 1024, max_stream_queue=100_000)
    kept_count, late = 8000, 50
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg, options=options) as server:
        raw = await RawGotalk.connect(server.url.port)
        drain: asyncio.Task[None] | None = None
        try:
            await wait_until(lambda: len(server.peers) == 1)
            [peer] = server.peers
            raw.write(gotalk.StreamRequest(b"0001", "collect", b""))
            raw.request_alone(b"0002", "big", b"8388608")  # 8 MiB it does not read yet
            await wait_until(lambda: peer.outbox.blocked)
            for n in range(1, kept_count + 1):
                raw.write(gotalk.StreamRequestPart(b"0001", str(n).encode()))
            await wait_until(lambda: len(peer._kept.messages) == kept_count and peer.reading)

            async def drained() -> None:
                while await raw.reader.read(1 << 20):
                    pass

            drain = asyncio.ensure_future(drained())  # the output drains: kept parts run
            async with asyncio.timeout(10):
                await started.wait()
                for n in range(kept_count + 1, kept_count + late + 1):
                    raw.write(gotalk.StreamRequestPart(b"0001", str(n).encode()))
                raw.write(gotalk.StreamRequestPart(b"0001", b""))
                await done.wait()
            assert seen == list(range(1, kept_count + late + 1))
        finally:
            if drain is not None:
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await drain
            await raw.close()


async def reply(raw: RawGotalk) -> Any:
    """The next message but our own announcement's answer."""
    while isinstance(message := await raw.next(), gotalk.Notification):
        pass
    return message


async def test_a_part_refused_for_max_request_bytes_does_not_spin_the_loop() -> None:
    """A part of a running stream refused while ``max_request_bytes`` is taken (by its
    own queued parts, which its handler has not read yet) waits for room, kept;
    a turn at the backlog meanwhile (another handler ended) must not re-arm itself every
    loop iteration until the handler reads (a busy loop at full CPU)."""
    gate = asyncio.Event()
    nap_gate = asyncio.Event()
    reg = rpc.Registry()

    @reg.handle_stream("later")
    async def later(parts: Any) -> list[int]:
        await gate.wait()
        return [len(part) async for part in parts]

    @reg.handle("nap")
    async def nap(value: Any) -> Any:
        await nap_gate.wait()
        return value

    options = rpc.Options(max_request_bytes=100_000)
    async with served_raw(reg, options) as (raw, peer):
        kept = peer._kept
        raw.request_alone(b"0002", "nap", b"1")
        raw.write(gotalk.StreamRequest(b"0001", "later", b""))
        part = b'"' + b"x" * 60_000 + b'"'
        for _ in range(3):  # the third finds max_request_bytes taken
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        raw.write(gotalk.StreamRequestPart(b"0001", b""))
        await wait_until(lambda: len(kept) == 2)  # the third part and the end wait
        nap_gate.set()  # a handler ends: the peer takes a turn at its backlog
        async with asyncio.timeout(5):
            answer = await reply(raw)
        assert answer == gotalk.Result(b"0002", b"1")
        for _ in range(20):  # loop iterations: a turn that re-arms itself is still due
            await asyncio.sleep(0)
        assert len(kept) == 2 and kept.turn is None
        gate.set()
        async with asyncio.timeout(5):
            answer = await reply(raw)
        assert answer == gotalk.StreamResult(b"0001", b"[60000,60000,60000]")


async def test_parts_past_max_request_bytes_reach_a_handler_while_requests_wait_for_slots() -> None:
    """A request holds all but 100 bytes of ``max_request_bytes`` and a stream's handler
    the other slot; 200 requests wait for a slot (a peer without retry results). Each of
    300 parts of 200 bytes fills the limit until the handler takes it: the parts that wait
    for room are set aside by stream and go first when room comes back, not behind the
    requests that wait for the slot the stream's handler holds (a look over the backlog
    each time room came back cost a part up to 5 ms at 16,384 kept: helper-99's review of
    c655033)."""
    gate = asyncio.Event()
    seen: list[int] = []
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(value: Any) -> int:
        await gate.wait()
        return len(value)

    @reg.handle_stream("sink")
    async def sink(parts: Any) -> int:
        async for part in parts:
            seen.append(len(part))
        return len(seen)

    limit = 2 * 1024 * 1024
    options = rpc.Options(max_concurrent=2, max_request_bytes=limit)
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        raw.request_alone(b"0001", "hold", b'"' + b"x" * (limit - 102) + b'"')
        raw.write(gotalk.StreamRequest(b"0002", "sink", b""))
        await wait_until(lambda: peer.handlers_running == 2)
        for n in range(200):  # no slot: kept, reading goes on
            raw.request_alone(b"%04d" % (1000 + n), "hold", b'"k"')
        await wait_until(lambda: len(peer._kept) == 200 and peer.reading)
        for _ in range(300):
            raw.write(gotalk.StreamRequestPart(b"0002", b'"' + b"p" * 198 + b'"'))
        await wait_until(lambda: len(seen) == 300, timeout=10)
        assert len(peer._kept) == 200  # the requests still wait for their slot
        gate.set()
        raw.write(gotalk.StreamRequestPart(b"0002", b""))
        answers = 0
        async with asyncio.timeout(10):
            while answers < 202:  # every request and the stream
                if not isinstance(await reply(raw), gotalk.Notification):
                    answers += 1

"""A forger that fills a node's ``max_queued_bytes`` with frames for sinks that never read
does not starve the node's honest traffic: a frame that finds the budget full takes room
from the link holding the most bytes, when that link holds more than the taker would.
Frames a stalled sink was given and never read still reach the rest of their chunk, even
the copies it let go for room. Finding the link that holds the most is exact (checked
against a walk). On asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random

from rpc.group import NetID
from rpc.group.items import QueueBytes
from tests.group_helpers import Member, RawPeer, frame, group, on_both_loops, wait_for

FORGER = NetID("10.66.0.1", 6666)
KiB = 1 << 10
MiB = 1 << 20
# A small budget, copies kept to resend for the whole test (so what the forger's sinks
# hold stays counted whether the kernel took it or not) and stalls left to a later timer.
OPTIONS = {
    "max_queued_bytes": 2 * MiB,
    "max_queue_bytes": MiB,
    "resend_window": 30.0,
    "write_stall_timeout": 30.0,
    "send_timeout": 1.0,
}


@on_both_loops
async def test_honest_traffic_flows_while_a_forger_fills_the_byte_budget() -> None:
    """Before, once the forger's frames held ``max_queued_bytes`` every queue counted as
    full: a's own broadcast to b waited ``send_timeout`` and was dropped, and a frame from
    an honest member that named b was skipped, until the sinks stalled out (and the forger
    names new ones)."""
    async with contextlib.AsyncExitStack() as stack:
        sinks = [await stack.enter_async_context(RawPeer("stall")) for _ in range(4)]
        a, b = await stack.enter_async_context(group(2, **OPTIONS))
        await a.node.notify("chat", "warm up")  # a's join goes now, not with the canary
        await wait_for(lambda: ("chat", "warm up") in b.got)
        dist = tuple(s.netid for s in sinks)
        blob = os.urandom(256 * KiB)
        _, writer = await asyncio.open_connection(*a.node.address)
        forged = [frame(FORGER, FORGER, seq, "nobody", blob, dist) for seq in range(1, 9)]
        # then small frames, to fill what is left to less than one of them
        filler = os.urandom(KiB)
        forged += [frame(FORGER, FORGER, seq, "nobody", filler, dist) for seq in range(9, 2000)]
        writer.write(b"".join(forged))
        await writer.drain()
        await wait_for(lambda: a.node.stats.frames_received >= len(forged))
        writer.close()
        # the sinks hold the budget (before, to within one filler frame: full), and it
        # turned frames away
        assert a.node.footprint().queued_bytes > MiB
        assert a.node.stats.overflows > 0
        canary = os.urandom(4 * KiB)
        began = asyncio.get_running_loop().time()
        await a.node.notify("blob", canary)
        await wait_for(lambda: ("blob", canary) in b.got, timeout=2)
        assert asyncio.get_running_loop().time() - began < 2
        # an honest member's broadcast that a forwards to b gets through too
        honest = NetID("127.0.0.1", 1)
        _, writer = await asyncio.open_connection(*a.node.address)
        writer.write(frame(honest, honest, 1, "blob", canary * 2, (b.node.netid,)))
        await writer.drain()
        writer.close()
        await wait_for(lambda: ("blob", canary * 2) in b.got, timeout=2)
        assert a.node.footprint().queued_bytes <= 2 * MiB


@on_both_loops
async def test_frames_shed_from_a_sinks_kept_copies_still_reach_the_rest_of_the_chunk() -> None:
    """a forwards 128 frames to a sink s with c as the rest of their chunk; s never reads,
    so every frame it did not read must go on to c. Meanwhile frames for c fill the budget
    and take room from s. Before, s let go of its kept copies (frames it never read, in
    the kernel or its transport) without handing them on: c never got them, and neither
    ``stats.shed`` nor ``stats.dropped`` counted them (review 184)."""
    opts = {
        "max_queued_bytes": 20 * MiB,
        "max_queue_bytes": 16 * MiB,
        "resend_window": 30.0,
        "write_stall_timeout": 0.5,
    }
    async with contextlib.AsyncExitStack() as stack:
        sink = await stack.enter_async_context(RawPeer("stall"))
        a, c = Member(), Member()
        await a.start(**opts)
        stack.push_async_callback(a.node.close)
        await c.start()
        stack.push_async_callback(c.node.close)
        # [s, c, x] splits into chunks [s, c] and [x]: s is c's head (x reads)
        x = await stack.enter_async_context(RawPeer("read"))
        dist = (sink.netid, c.node.netid, x.netid)
        count = 128
        blobs = [i.to_bytes(4, "big") + os.urandom(64 * KiB - 4) for i in range(count)]
        to_sink = [frame(FORGER, FORGER, i + 1, "blob", blobs[i], dist) for i in range(count)]
        _, writer = await asyncio.open_connection(*a.node.address)
        writer.write(b"".join(to_sink))
        await writer.drain()
        await wait_for(lambda: a.node.stats.frames_received >= count)
        # frames for c alone (8 MiB + 4.5 MiB > 12 MiB left to s and c): the budget fills
        filler = os.urandom(64 * KiB)
        to_c = [
            frame(FORGER, FORGER, 1000 + i, "blob", filler + bytes([i]), (c.node.netid,))
            for i in range(72)
        ]
        writer.write(b"".join(to_c))
        await writer.drain()
        writer.close()
        wanted = set(blobs)
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: wanted <= {v for k, v in c.got if k == "blob"}, timeout=3)
        missing = sorted(int.from_bytes(b[:4], "big") for b in wanted - {v for _, v in c.got})
        stats = a.node.stats
        assert not missing, f"{len(missing)} never reached c: {stats}"
        assert stats.shed > 0  # s made room, and counted what it handed on


class Sink:
    """A holder that gives back what it is asked for (as a link would), checking that no
    other holds more than it does when asked."""

    def __init__(self, budget: QueueBytes, others: list[Sink]) -> None:
        self.budget = budget
        self.others = others
        self.asked = 0

    def shed(self, need: int) -> int:
        holds = self.budget.holds(self)
        assert holds == max(self.budget.holds(s) for s in self.others)
        self.asked += 1
        freed = min(need, holds)
        self.budget.release(self, freed)
        return freed


def test_the_link_asked_for_room_is_one_holding_the_most() -> None:
    """Holdings change at random (frames queued and let go, links emptied); each time the
    budget is full, every link asked to shed holds the most (by a walk of them all), and
    none is asked when none holds more than the taker would."""
    rng = random.Random(184)
    budget = QueueBytes(10_000)
    sinks: list[Sink] = []
    sinks += [Sink(budget, sinks) for _ in range(50)]
    taker = Sink(budget, sinks)
    full = 0
    for _ in range(20_000):
        sink = rng.choice(sinks)
        size = rng.randrange(1, 300)
        if rng.random() < 0.02:
            budget.release(sink, budget.holds(sink))  # the link ended
        elif rng.random() < 0.2:
            budget.release(sink, min(budget.holds(sink), size))
        elif budget.room_for(size):
            budget.add(sink, size)
        else:
            full += 1
            most = max(budget.holds(s) for s in sinks)
            asked = sum(s.asked for s in sinks)
            if budget.make_room(size, taker):
                assert budget.room_for(size)
            if most <= size:
                assert sum(s.asked for s in sinks) == asked
    assert full > 1000
    assert sum(s.asked for s in sinks) > 500
    assert budget.held == sum(budget.holds(s) for s in sinks)
    # a taker holding the most gets no room from the others
    budget.add(taker, budget.limit)
    assert not budget.make_room(1, taker)

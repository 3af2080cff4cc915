"""A forger that fills a node's ``max_queued_bytes`` with frames for sinks that never read
does not starve the node's honest traffic: a frame that finds the budget full takes room
from the link holding the most bytes, when that link holds more than the taker would.
Frames a stalled sink was given and never read still reach the rest of their chunk, even
the copies it let go for room. Finding the link that holds the most is exact (checked
against a walk), one that cannot give back (paused, holding only its last write) is
passed over for the next (and asked again once its writes resume), and the budget keeps
no link that holds nothing alive. On asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import socket
import weakref
from typing import cast

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


def frames_past_the_kernel(frame_size: int, rcvbuf: int) -> int:
    """How many frames of ``frame_size`` bytes a link must write to a peer that never reads
    (whose receive buffer is ``rcvbuf``) for the kernel to refuse some: twice what the
    sender's buffer may grow to (Linux's ``tcp_wmem`` maximum; 4 MiB if unknown) and the
    peer's, and at least 128."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            wmem = int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        wmem = 4 * MiB
    return max(128, -(-2 * (wmem + rcvbuf) // frame_size))


@on_both_loops
async def test_frames_shed_from_a_sinks_kept_copies_still_reach_the_rest_of_the_chunk() -> None:
    """a forwards frames to a sink s with c as the rest of their chunk; s never reads, so
    every frame it did not read must go on to c. Meanwhile frames for c fill the budget
    and take room from s. Before, s let go of its kept copies (frames it never read, in
    the kernel or its transport) without handing them on: c never got them, and neither
    ``stats.shed`` nor ``stats.dropped`` counted them (review 184). a sends s more than
    the kernel can hold (s's receive buffer is set small, a's send buffer may grow to the
    host's maximum), so its writes pause with copies of earlier writes kept: checked."""
    rcvbuf = 64 * KiB
    count = frames_past_the_kernel(64 * KiB, 2 * rcvbuf)  # 128 (8 MiB) with a 4 MiB max
    opts = {  # s and x each hold count * 64 KiB: 20 MiB and 16 MiB for 128
        "max_queued_bytes": count * 160 * KiB,
        "max_queue_bytes": count * 128 * KiB,
        "resend_window": 30.0,
        "write_stall_timeout": 0.5,
    }
    async with contextlib.AsyncExitStack() as stack:
        sink = await stack.enter_async_context(RawPeer("stall"))
        # accepted sockets inherit it (a peer that never reads keeps this window)
        sink.server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        a, c = Member(), Member()
        await a.start(**opts)
        stack.push_async_callback(a.node.close)
        await c.start()
        stack.push_async_callback(c.node.close)
        # [s, c, x] splits into chunks [s, c] and [x]: s is c's head (x reads)
        x = await stack.enter_async_context(RawPeer("read"))
        dist = (sink.netid, c.node.netid, x.netid)
        blobs = [i.to_bytes(4, "big") + os.urandom(64 * KiB - 4) for i in range(count)]
        to_sink = [frame(FORGER, FORGER, i + 1, "blob", blobs[i], dist) for i in range(count)]
        _, writer = await asyncio.open_connection(*a.node.address)
        writer.write(b"".join(to_sink))
        await writer.drain()
        await wait_for(lambda: a.node.stats.frames_received >= count)
        (link,) = (k for k in a.node._router.links if k.netid == sink.netid)

        def paused_with_earlier_copies() -> bool:  # what the shed must hand on
            return not link._writable.is_set() and len(link._recent) > link._last_write

        await wait_for(paused_with_earlier_copies)
        # frames for c alone (8 MiB + 4.5 MiB > 12 MiB left to s and c, for 128): the
        # budget fills
        filler = os.urandom(64 * KiB)
        to_c = [
            frame(
                FORGER,
                FORGER,
                count + 1 + i,
                "blob",
                filler + i.to_bytes(4, "big"),
                (c.node.netid,),
            )
            for i in range(count * 9 // 16)
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
    """A holder that gives back what it is asked for (as a link would), unless ``stuck``
    (as a paused link holding only its last write), checking that no other that can give
    holds more than it does when asked."""

    def __init__(self, budget: QueueBytes, others: list[Sink]) -> None:
        self.budget = budget
        self.others = others
        self.counted = 0
        self.asked = 0
        self.stuck = False

    def shed(self, need: int) -> int:
        assert self.counted >= max((s.counted for s in self.others if not s.stuck), default=0)
        self.asked += 1
        if self.stuck:
            return 0
        freed = min(need, self.counted)
        self.budget.release(self, freed)
        return freed


def test_the_link_asked_for_room_is_one_holding_the_most() -> None:
    """Holdings change at random (frames queued and let go, links ending and new ones in
    their place, which may get an ended one's ``id``; now and then most links empty, so
    the budget stops watching; some cannot give back, for a while); each time the budget
    is full, every link asked to shed holds the most of those that can give (by a walk of
    them all), none is asked when none holds more than the taker would, and room is
    refused only when no link that can give holds more than the taker would. The heap
    stays within twice the links holding now (plus 64)."""
    rng = random.Random(184)
    budget = QueueBytes(10_000)
    sinks: list[Sink] = []
    sinks += [Sink(budget, sinks) for _ in range(50)]
    taker = Sink(budget, sinks)
    full = asked = ended = unwatched = passed = 0
    for _ in range(20_000):
        i = rng.randrange(len(sinks))
        sink = sinks[i]
        size = rng.randrange(1, 300)
        if rng.random() < 0.01:  # writes pause with only the last write held, or resume
            sink.stuck = not sink.stuck
            if not sink.stuck:
                budget.can_give(sink)
        elif rng.random() < 0.02:
            asked += sink.asked
            budget.release(sink, sink.counted)  # the link ended; a new one takes its place
            sinks[i] = Sink(budget, sinks)
            del sink
            ended += 1
        elif rng.random() < 0.002:  # links empty till at most half is held
            for s in sinks:
                if budget.held <= budget.limit // 2:
                    break
                budget.release(s, s.counted)
            assert not budget._heap  # not watched (as after a drain)
            unwatched += 1
        elif rng.random() < 0.2:
            budget.release(sink, min(sink.counted, size))
        elif budget.held + size <= budget.limit:
            assert budget.take(size, sink)
        else:
            full += 1
            most = max(s.counted for s in sinks)
            givers = max((s.counted for s in sinks if not s.stuck), default=0)
            before = sum(s.asked for s in sinks)
            if budget.make_room(size, taker):
                assert budget.held + size <= budget.limit
                passed += most > givers
            else:  # what the givers hold now, after any they gave
                left = max((s.counted for s in sinks if not s.stuck), default=0)
                assert left <= size and budget.held + size > budget.limit
            if most <= size:
                assert sum(s.asked for s in sinks) == before
            assert len(budget._heap) <= 2 * sum(s.counted > 0 for s in sinks) + 64 + 2
    assert full > 1000 and ended > 300 and unwatched > 10 and passed > 100
    assert asked + sum(s.asked for s in sinks) > 500
    assert budget.held == sum(s.counted for s in sinks)
    # a taker holding the most gets no room from the others
    for s in sinks:
        budget.release(s, s.counted)
    assert budget.take(budget.limit - 100, taker)
    assert budget.take(100, sinks[0])
    assert not budget.make_room(1, taker)
    assert not budget.take(1, taker)
    assert budget.held == budget.limit


def test_no_link_is_asked_when_none_holds_more_than_the_taker_would() -> None:
    """The random walk above never meets this case (its largest holder always holds more
    than a frame, so its check of it never runs): links that each hold no more than the
    taker would with the new bytes are not asked and the room is refused; a link holding
    one byte more is asked, alone."""
    budget = QueueBytes(10_000)
    sinks: list[Sink] = []
    sinks += [Sink(budget, sinks) for _ in range(50)]
    taker = Sink(budget, sinks)
    for s in sinks:
        assert budget.take(200, s)
    assert budget.held == budget.limit
    assert not budget.make_room(200, taker)
    assert [s.asked for s in sinks] == [0] * 50
    budget.release(sinks[0], 1)
    assert budget.take(1, sinks[7])  # 201: more than the taker would hold
    assert budget.make_room(200, taker)
    assert [i for i, s in enumerate(sinks) if s.asked] == [7] and sinks[7].asked == 1


class Giver:
    """A holder that gives back what it is asked for, or (``gives`` False) nothing."""

    def __init__(self, budget: QueueBytes, gives: bool = True) -> None:
        self.budget = budget
        self.gives = gives
        self.counted = 0
        self.asked = 0

    def shed(self, need: int) -> int:
        self.asked += 1
        freed = min(need, self.counted) if self.gives else 0
        self.budget.release(self, freed)
        return freed


def test_a_holder_that_cannot_give_back_does_not_stop_the_budget_asking_the_next() -> None:
    """Review 194: a holds the most and can give nothing back (a paused link holding only
    its last write), b could: before, the budget asked a, got nothing and refused the
    frame, with b still holding 400. Now it asks b; and a only once, not for every frame,
    until a can give again."""
    budget = QueueBytes(1000)
    a, b, t = Giver(budget, gives=False), Giver(budget), Giver(budget)
    assert budget.take(600, a) and budget.take(400, b)
    assert budget.take(10, t)
    assert (a.counted, b.counted, t.counted, budget.held) == (600, 390, 10, 1000)
    taken = 0
    while taken < 1000 and budget.take(1, t):
        taken += 1
    # b gave until it held no more than t would (fair); a was asked once, and once more
    # at each rebuild of the heap (after 64 pushes or more), not for each frame
    assert b.counted <= t.counted + 1 < b.counted + 2 and taken == 190
    assert a.asked <= 1 + taken // 64
    assert (a.counted, budget.held) == (600, a.counted + b.counted + t.counted)
    asked = a.asked
    assert not budget.take(1, t) and a.asked == asked
    a.gives = True  # its writes resumed
    budget.can_give(a)
    assert budget.take(1, t) and a.counted == 599 and a.asked == asked + 1
    assert budget.held == 1000 == a.counted + b.counted + t.counted


class Gone:
    """A holder that has nothing to give back."""

    counted = 0

    def shed(self, need: int) -> int:
        return 0


def test_a_link_that_holds_nothing_is_not_kept_alive_by_the_budget() -> None:
    """Review 191: links that let go of everything (they ended) stayed in the heap (built
    when the budget was full) until a later question reached them or a rebuild: while
    the budget had room, nothing asked, and every link that had been in it stayed alive."""
    budget = QueueBytes(1000)
    holders = [Gone() for _ in range(10)]
    for h in holders:
        h.counted = 0
        assert budget.take(100, h)
    assert not budget.make_room(10, Gone())  # full: the heap is built and asked
    refs = [weakref.ref(h) for h in holders]
    for h in holders[1:]:
        budget.release(h, 100)  # they end; the first one still holds
    del holders, h
    gc.collect()
    assert budget.held == 100
    alive = sum(r() is not None for r in refs)
    assert alive == 1, f"{alive - 1} ended holders still referenced by the budget"


@on_both_loops
async def test_links_that_stalled_out_are_not_kept_alive_by_the_budget() -> None:
    """Review 191, with links: sinks that never read fill the budget (it asks who holds
    the most), then stall out and end; none stays referenced."""
    opts = {
        "max_queued_bytes": 512 * KiB,
        "max_queue_bytes": 256 * KiB,
        "write_stall_timeout": 0.3,
        "resend_window": 0.2,
        "idle_timeout": 0.3,
    }
    async with contextlib.AsyncExitStack() as stack:
        sinks = [await stack.enter_async_context(RawPeer("stall")) for _ in range(4)]
        (a,) = await stack.enter_async_context(group(1, **opts))
        blob = os.urandom(64 * KiB)
        dist = tuple(s.netid for s in sinks)
        forged = [frame(FORGER, FORGER, seq, "nobody", blob, dist) for seq in range(1, 200)]
        _, writer = await asyncio.open_connection(*a.node.address)
        writer.write(b"".join(forged))
        await writer.drain()
        writer.close()
        await wait_for(lambda: a.node.stats.frames_received >= len(forged))
        links = list(a.node._router.links)
        assert links and a.node.stats.shed > 0  # the budget was full and asked who holds most
        refs = [weakref.ref(link) for link in links]
        del links
        await wait_for(lambda: a.node.footprint().links == 0, timeout=1.5)  # all ended
        assert a.node.footprint().queued_bytes == 0

        def alive() -> int:
            gc.collect()
            return sum(r() is not None for r in refs)

        with contextlib.suppress(TimeoutError):  # uvloop lets go of its transports later
            await wait_for(lambda: not alive(), timeout=1)
        assert not alive(), f"{alive()} ended links still referenced"


@on_both_loops
async def test_a_sink_holding_only_its_last_write_does_not_starve_honest_traffic() -> None:
    """Review 194: the forger gives sink s one frame larger than the kernel takes, so s's
    link is paused holding only its last write (which it keeps: its transport holds it),
    and s holds the most; other sinks fill the rest of the budget. Before, the budget
    asked s for room, got nothing and refused every frame, though the other sinks could
    give: a's broadcast to b waited ``send_timeout`` and was dropped (for up to
    ``write_stall_timeout``). Now the budget asks the next holder."""
    rcvbuf = 64 * KiB
    big = frames_past_the_kernel(1, rcvbuf) // 2 + 256 * KiB  # the kernel's share, and more
    opts = {
        "max_queued_bytes": 2 * big,
        "max_queue_bytes": 2 * big,
        "resend_window": 30.0,
        "write_stall_timeout": 30.0,
        "send_timeout": 1.0,
    }
    async with contextlib.AsyncExitStack() as stack:
        s = await stack.enter_async_context(RawPeer("stall"))
        s.server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        others = [await stack.enter_async_context(RawPeer("stall")) for _ in range(2)]
        a, b = await stack.enter_async_context(group(2, **opts))
        await a.node.notify("chat", "warm up")
        await wait_for(lambda: ("chat", "warm up") in b.got)
        _, writer = await asyncio.open_connection(*a.node.address)
        writer.write(frame(FORGER, FORGER, 1, "nobody", os.urandom(big), (s.netid,)))
        await writer.drain()
        await wait_for(lambda: any(k.netid == s.netid for k in a.node._router.links))
        (link,) = (k for k in a.node._router.links if k.netid == s.netid)

        def holds_only_its_last_write() -> bool:
            return not link._writable.is_set() and len(link._recent) == 1 and not link.queued

        await wait_for(holds_only_its_last_write)
        held = link.counted
        assert held > big
        # the other sinks fill the rest, each holding less than s, to within a small frame
        fillers = [os.urandom(64 * KiB)] * (big * 3 // (64 * KiB) // 2) + [os.urandom(KiB)] * 200
        forged = [
            frame(FORGER, FORGER, 2 + i, "nobody", filler, (others[i % 2].netid,))
            for i, filler in enumerate(fillers)
        ]
        writer.write(b"".join(forged))
        await writer.drain()
        writer.close()
        await wait_for(lambda: a.node.stats.frames_received >= len(forged) + 1)
        assert a.node.footprint().queued_bytes > 2 * big - 2 * KiB  # full for the canary
        assert holds_only_its_last_write() and link.counted == held
        canary = os.urandom(4 * KiB)
        began = asyncio.get_running_loop().time()
        await a.node.notify("blob", canary)
        await wait_for(lambda: ("blob", canary) in b.got, timeout=2)
        assert asyncio.get_running_loop().time() - began < 2
        assert link.counted == held  # s kept its last write; the others gave
        assert a.node.footprint().queued_bytes <= 2 * big


class LateReader(asyncio.Protocol):
    """A sink that does not read until told (:meth:`read`), then reads and drops it all
    (it may read for a loop turn once connected)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        # not here: uvloop starts reading after connection_made returns
        asyncio.get_running_loop().call_soon(self.transport.pause_reading)

    def data_received(self, data: bytes) -> None:
        pass

    def read(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


@on_both_loops
async def test_a_passed_over_link_whose_writes_resume_is_asked_again() -> None:
    """cf85074 / review 197: a link passed over (paused, holding only its last write) is
    asked again once its writes resume (:meth:`QueueBytes.can_give` from
    ``resume_writing``), not only when it takes more or the heap is rebuilt. Sink s holds
    one frame of nearly all the budget as its paused last write; a forged frame for
    another sink finds the budget full, asks s, gets nothing and is refused (s passed
    over). Then s reads: its link resumes and its copy can go. a's broadcast to b must
    take room from s; with ``can_give`` a no-op nobody asks s and it is refused."""
    rcvbuf = 64 * KiB
    big = frames_past_the_kernel(1, rcvbuf) // 2 + MiB  # the kernel's share, and more
    opts = {
        "max_queued_bytes": big + 3 * KiB,
        "max_queue_bytes": 2 * big,
        "resend_window": 30.0,
        "write_stall_timeout": 30.0,
        "send_timeout": 0.5,
    }
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        sink = LateReader()
        server = await loop.create_server(lambda: sink, "127.0.0.1", 0)
        stack.callback(server.close)
        stack.callback(sink.close)
        server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s = NetID("127.0.0.1", server.sockets[0].getsockname()[1])
        other = await stack.enter_async_context(RawPeer("stall"))
        a, b = await stack.enter_async_context(group(2, **opts))
        await a.node.notify("chat", "warm up")
        await wait_for(lambda: ("chat", "warm up") in b.got)
        _, writer = await asyncio.open_connection(*a.node.address)
        stack.callback(writer.close)
        writer.write(frame(FORGER, FORGER, 1, "nobody", os.urandom(big), (s,)))
        await writer.drain()
        await wait_for(lambda: any(k.netid == s for k in a.node._router.links))
        (link,) = (k for k in a.node._router.links if k.netid == s)

        def holds_only_its_last_write() -> bool:
            return not link._writable.is_set() and len(link._recent) == 1 and not link.queued

        await wait_for(holds_only_its_last_write)
        held = link.counted
        assert a.node.footprint().queued_bytes + 4 * KiB > big + 3 * KiB  # full for 4 KiB
        overflows = a.node.stats.overflows
        writer.write(frame(FORGER, FORGER, 2, "nobody", os.urandom(8 * KiB), (other.netid,)))
        await writer.drain()
        await wait_for(lambda: a.node.stats.overflows > overflows)  # s asked, passed over
        assert link.counted == held
        sink.read()
        await wait_for(link._writable.is_set)  # resume_writing: s's copy may go now
        assert link.counted == held  # kept to resend: nothing asked s since
        canary = os.urandom(4 * KiB)
        await a.node.notify("blob", canary)
        await wait_for(lambda: ("blob", canary) in b.got, timeout=1)
        assert link.counted < held  # s gave its copy

"""A forger that fills a node's ``max_queued_bytes`` with frames for sinks that never read
does not starve the node's honest traffic: a frame that finds the budget full takes room
from the link holding the most bytes, when that link holds more than the taker would.
Frames a stalled sink was given and never read still reach the rest of their chunk, even
the copies it let go for room. A link that cannot give back (paused, holding only its
last write) is passed over for the next, and asked again once its writes resume; links
that stalled out are not kept alive. On asyncio and uvloop. The budget alone, without
sockets: tests/test_group_budget_model.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import weakref
from typing import cast

from rpc.group import NetID
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

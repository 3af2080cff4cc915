"""A forger that fills a node's ``max_queued_bytes`` with frames for sinks that never read
does not starve the node's honest traffic: a frame that finds the budget full takes room
from the link holding the most bytes, when that link holds more than the taker would.
On asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import os

from rpc.group import NetID
from tests.group_helpers import RawPeer, frame, group, on_both_loops, wait_for

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

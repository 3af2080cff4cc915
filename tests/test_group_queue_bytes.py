"""Group links hold a bounded number of bytes, not only of frames: ``max_queue_bytes`` per
link, ``max_queued_bytes`` for the node, frames kept for resending included (let go once
``resend_window`` has passed), on asyncio and uvloop.

The bytes are counted by walking the links' queues here, apart from the node's own counter
(``footprint().queued_bytes``), which must agree with that walk."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

from rpc.group import GroupNode, GroupOptions, NetID
from tests.group_helpers import RawPeer, frame, group, on_both_loops, sampling, wait_for

ATTACKER = NetID("10.66.0.1", 6666)
MiB = 1 << 20


def link_bytes(node: GroupNode) -> dict[NetID, tuple[int, int]]:
    """Per link: (payload bytes of the frames it holds, their size as the limits count it:
    the payload plus 64 per node named in the rest of the chunk)."""
    held = {}
    for link in node._router.links:
        items = [*link._pending, *link._recent]
        payload = sum(len(i.payload) for i in items)
        held[link.netid] = (payload, payload + 64 * sum(len(i.rest) for i in items))
    return held


class Held:
    """Samples what a node's links hold on every loop turn while open: the largest payload
    bytes per link and in all, and whether the node's counter always matched the walk."""

    def __init__(self, node: GroupNode) -> None:
        self.node = node
        self.most = 0
        self.most_per_link = 0
        self.mismatches: list[tuple[int, int]] = []

    def sample(self) -> None:
        held = link_bytes(self.node).values()
        self.most = max(self.most, sum(payload for payload, _ in held))
        self.most_per_link = max([self.most_per_link, *(payload for payload, _ in held)])
        counted = sum(size for _, size in held)
        reported = getattr(self.node.footprint(), "queued_bytes", None)
        if reported != counted:
            self.mismatches.append((counted, reported or -1))

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[Held]:
        async with sampling(self.sample):
            yield self


@on_both_loops
async def test_forged_lists_naming_sinks_that_never_read_hold_bounded_bytes() -> None:
    """A forger names 12 sinks that accept and never read in 160 frames of 1 MiB: each link
    holds at most its queue and its resend copies (2 x 16 MiB), the node 128 MiB (the
    defaults); before, every link queued up to 256 frames of any size."""
    async with contextlib.AsyncExitStack() as stack:
        sinks = [await stack.enter_async_context(RawPeer("stall")) for _ in range(12)]
        (a,) = await stack.enter_async_context(group(1))
        dist = tuple(s.netid for s in sinks)
        blob = os.urandom(MiB)  # incompressible: nothing shrinks on the way
        frames = [frame(ATTACKER, ATTACKER, i + 1, "nobody", blob, dist) for i in range(160)]
        async with Held(a.node).watching() as held:
            _, writer = await asyncio.open_connection(*a.node.address)
            for data in frames:
                writer.write(data)
                await writer.drain()
            await wait_for(lambda: a.node.stats.frames_received == 160, timeout=20)
        writer.close()
        assert held.most_per_link <= 2 * 16 * MiB, held.most_per_link
        assert held.most <= 128 * MiB, held.most
        assert a.node.stats.overflows > 0  # frames were refused, as at max_queue
        assert held.most >= 64 * MiB  # the sinks did fill what they may
        assert held.mismatches == []
        defaults = GroupOptions()
        assert (defaults.max_queue_bytes, defaults.max_queued_bytes) == (16 * MiB, 128 * MiB)
        # the sinks go away: every path that ends a link lets its bytes go
        for sink in sinks:
            await sink.__aexit__(None, None, None)
        await wait_for(lambda: a.node.footprint().queued_bytes == 0, timeout=15)
        assert link_bytes(a.node) == {} or set(link_bytes(a.node).values()) == {(0, 0)}


@on_both_loops
async def test_copies_kept_for_resending_are_let_go_after_resend_window() -> None:
    async with group(2, resend_window=0.3) as (a, b):
        blob = os.urandom(MiB)
        await a.node.notify("blob", blob)
        await wait_for(lambda: ("blob", blob) in b.got)
        counted = a.node.footprint().queued_bytes
        assert MiB <= counted == sum(size for _, size in link_bytes(a.node).values())
        # nothing else is sent: a timer, not a later frame, lets the copy go
        await wait_for(lambda: a.node.footprint().queued_bytes == 0, timeout=2)
        assert a.node.stats.frames_sent == 2  # a's join (started without peers), the blob


@on_both_loops
async def test_a_peer_that_reads_nothing_is_given_up_with_nothing_more_to_send() -> None:
    """One frame larger than the socket buffers, then nothing: the link idled 30 s with the
    frame counted (and a transport full); now the stall timer gives the peer up."""
    opts = {"write_stall_timeout": 0.3, "send_timeout": 0.3}
    async with RawPeer("stall") as staller, group(1, **opts) as (a,):
        a.node.add_peer(staller.netid)
        await a.node.notify("blob", os.urandom(12 * MiB))
        await wait_for(lambda: a.node.stats.stalls == 1, timeout=3)
        assert a.node.footprint().queued_bytes == 0
        assert a.node.footprint().write_buffered == 0

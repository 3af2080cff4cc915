"""A node's join reaches the members it learns after its start, and a join sent at start
does not leave its first broadcast to race it: every member gets a join down the tree of
the broadcast it must precede. Members keep a window per origin, so a node restarted with
its clock set back is heard only by members its join reached."""

from __future__ import annotations

import random
import time

import pytest

from rpc.group import NetID
from tests.group_helpers import Member, frame, free_port, group, on_both_loops, send_raw, wait_for


async def previous_life(me: NetID, *members: Member) -> None:
    """Play ``me``'s earlier life, its clock an hour ahead: each member's window for ``me``
    ends far above the numbers of its new life."""
    ahead = time.time_ns() // 1000 + 3600 * 10**6
    for m in members:
        await send_raw(m.node.netid, frame(me, me, ahead, "chat", "previous life"))
    await wait_for(lambda: all(m.got == [("chat", "previous life")] for m in members))


@on_both_loops
async def test_a_member_learned_after_the_join_gets_it_before_the_next_broadcast() -> None:
    """The restarted node joins through its seed ``a``, which does not know ``b`` yet; it
    learns ``b`` later (``b`` speaks to it). Before, its join had gone (at start) and was
    never sent again: ``b`` took every broadcast of the new life for an old duplicate."""
    port = free_port()
    me = NetID("127.0.0.1", port)
    a, b, restarted = Member(), Member(), Member()
    await a.start(learn=True)
    await b.start(learn=True)
    try:
        await previous_life(me, b)
        await restarted.start([a.node.netid], port=port, learn=True)
        await wait_for(lambda: me in a.node.members)  # its join reached its seed
        assert b.node.netid not in restarted.node.members
        b.node.add_peer(me)
        await b.node.notify("chat", "from b")  # b's join and broadcast: restarted learns b
        await wait_for(lambda: ("chat", "from b") in restarted.got)
        assert b.node.netid in restarted.node.members
        await restarted.node.notify("chat", "new life")
        # (b may count a duplicate: a, a learning seed handed the join straight from its
        # origin, passes it through its own tree too; before, b dropped the broadcast)
        await wait_for(lambda: ("chat", "new life") in a.got)
        await wait_for(lambda: len(b.got) == 2, timeout=2)
        assert b.got[1:] == [("chat", "new life")]
        assert restarted.node.stats.broadcasts == 1
    finally:
        for m in (restarted, b, a):
            if hasattr(m, "node"):
                await m.node.close()


@pytest.mark.parametrize("size", [3, 7])
@on_both_loops
async def test_first_broadcast_after_a_join_at_start_reaches_every_member(size: int) -> None:
    """A node restarted with its clock set back and its members as ``peers`` joins at
    start, then broadcasts at once. Over seeds 0-7 no member takes the broadcast for a
    duplicate. Before, the join at start took a tree of its own and was not sent again:
    a member it reached through a forwarder could get the broadcast straight from the
    restarted node first, its window still its previous life's, and drop it."""
    async with group(size) as members:
        failed = {}
        nodes = [m.node for m in members]
        for seed in range(8):
            port = free_port()
            await previous_life(NetID("127.0.0.1", port), *members)
            before = [n.stats.duplicates for n in nodes]

            def duplicates(before: list[int] = before) -> list[int]:
                return [n.stats.duplicates - b for n, b in zip(nodes, before, strict=True)]

            restarted = Member()
            peers = [n.netid for n in nodes]
            await restarted.start(peers, port=port, rng=random.Random(seed))
            try:
                await restarted.node.notify("chat", "new life")
                await wait_for(lambda: all(len(m.got) == 2 for m in members) or any(duplicates()))
                if any(duplicates()):
                    failed[seed] = duplicates()
            finally:
                await restarted.node.close()
                for m in members:
                    m.got.clear()
        assert failed == {}

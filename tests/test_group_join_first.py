"""A node's join goes to every member before its first broadcast, peers at start or not, and
to a static member added later before its next one: a node restarted with its clock set
back is heard again however its members were given. Members still reset a window only on
a join, not on any frame or connection. The join and the broadcast after it go down one
tree, so every member of it gets the join first (before, the join took a tree of its own,
and in a group of three or more a member could get the broadcast first and drop it)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from rpc.group import NetID
from tests.group_helpers import (
    Member,
    RawPeer,
    frame,
    free_port,
    group,
    on_both_loops,
    send_raw,
    wait_for,
)


async def previous_life(me: NetID, *members: Member) -> None:
    """Play ``me``'s earlier life, its clock an hour ahead (a reboot before NTP stepped it
    back): each member's window for ``me`` ends far above the new life's numbers."""
    ahead = time.time_ns() // 1000 + 3600 * 10**6
    for m in members:
        await send_raw(m.node.netid, frame(me, me, ahead, "chat", "previous life"))
    await wait_for(lambda: all(m.got == [("chat", "previous life")] for m in members))


@on_both_loops
async def test_node_started_without_peers_joins_before_its_first_broadcast() -> None:
    # Before, only a node started with peers sent a join: one given its members with
    # add_peer had every broadcast taken for an old duplicate.
    async with group(2) as (a, b):
        port = free_port()
        await previous_life(NetID("127.0.0.1", port), a, b)
        restarted = Member()
        await restarted.start(port=port)
        try:
            restarted.node.add_peer(a.node.netid)
            restarted.node.add_peer(b.node.netid)
            await restarted.node.notify("chat", "new life")
            nodes = (a.node, b.node)
            await wait_for(
                lambda: (
                    all(len(m.got) == 2 for m in (a, b)) or any(n.stats.duplicates for n in nodes)
                )
            )
            assert [m.got[1:] for m in (a, b)] == [[("chat", "new life")]] * 2
            assert [n.stats.duplicates for n in nodes] == [0, 0]
            assert restarted.node.stats.broadcasts == 1  # the join is not counted
        finally:
            await restarted.node.close()


@on_both_loops
async def test_static_member_added_after_the_join_gets_it_before_the_next_broadcast() -> None:
    async with group(2) as (a, b):
        port = free_port()
        await previous_life(NetID("127.0.0.1", port), b)
        restarted = Member()
        await restarted.start([a.node.netid], port=port)  # its join goes to a only
        try:
            restarted.node.add_peer(b.node.netid)
            await restarted.node.notify("chat", "new life")
            await wait_for(lambda: len(b.got) == 2 or b.node.stats.duplicates > 0)
            assert b.got[1:] == [("chat", "new life")]
            assert b.node.stats.duplicates == 0
            await wait_for(lambda: a.got == [("chat", "new life")])
        finally:
            await restarted.node.close()


@on_both_loops
async def test_a_frame_that_is_not_a_join_resets_no_window() -> None:
    # What a forger (or a replay) needs to reset a window stays a join: an old number on a
    # new connection, straight from its origin, is still a duplicate.
    async with group(1) as (b,):
        me = NetID("127.0.0.1", free_port())
        await previous_life(me, b)
        now = time.time_ns() // 1000
        await send_raw(b.node.netid, frame(me, me, now, "chat", "not a join"))
        await wait_for(lambda: b.node.stats.duplicates == 1)
        assert b.got == [("chat", "previous life")]


@on_both_loops
async def test_a_notify_that_sends_the_join_waits_send_timeout_in_all() -> None:
    # The join and the broadcast after it share one send_timeout for full queues, not one
    # each (a notify would otherwise wait twice as long once per life).
    limit = 1.0
    opts = {"send_timeout": limit, "max_queued_bytes": 1, "resend_window": 30.0}
    async with RawPeer() as peer, group(1, **opts) as (a,):
        a.node.add_peer(peer.netid)
        # a forwards one frame to peer before its own first broadcast: the copy it keeps
        # to resend is all max_queued_bytes allows, so every queue counts as full
        stranger = NetID("127.0.0.1", free_port())
        await send_raw(a.node.netid, frame(stranger, stranger, 1, "chat", "x", (peer.netid,)))
        await wait_for(lambda: len(peer.frames) == 1)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await a.node.notify("chat", "mine")
        assert loop.time() - began < 1.5 * limit  # twice the limit before
        assert a.node.stats.overflows == 2  # the join, then the broadcast, not queued
        assert len(peer.frames) == 1


async def restart_and_notify(members: list[Member], seed: int) -> list[int]:
    """Restart a node of ``members``' group with its clock set back and ``Random(seed)``
    (each time on a new port: a new origin for the members), give it its members with
    add_peer and notify once; returns what each member dropped as a duplicate, once every
    member has the broadcast or one has dropped something."""
    port = free_port()
    await previous_life(NetID("127.0.0.1", port), *members)
    nodes = [m.node for m in members]
    before = [n.stats.duplicates for n in nodes]

    def duplicates() -> list[int]:
        return [n.stats.duplicates - b for n, b in zip(nodes, before, strict=True)]

    restarted = Member()
    await restarted.start(port=port, rng=random.Random(seed))
    try:
        for m in members:
            restarted.node.add_peer(m.node.netid)
        await restarted.node.notify("chat", "new life")
        await wait_for(lambda: all(len(m.got) == 2 for m in members) or any(duplicates()))
        assert all(m.got[1:] in ([], [("chat", "new life")]) for m in members)
        return duplicates()
    finally:
        await restarted.node.close()
        for m in members:
            m.got.clear()


@pytest.mark.parametrize("size", [3, 7])
@on_both_loops
async def test_first_broadcast_after_a_set_back_restart_reaches_every_member(size: int) -> None:
    """Over seeds 0-7, no member takes the restarted node's first broadcast for a
    duplicate. 0f79bb5 sent the join down a tree of its own: the planner shuffles each
    broadcast's targets anew, so with three members (chunks of two and one) a member the
    join reached through a forwarder could get the broadcast straight from the restarted
    node first, its window still its previous life's, and drop it as a duplicate (seeds 0,
    1, 2 and 6 did). With seven a chunk holds four, its head forwarding to three, one of
    them through another: forwarders shuffled their list anew for each frame, so with the
    join and the broadcast down the same chunks but forwarders still shuffling, 4 to 6 of
    the seeds failed. Now the join and the broadcast go down the same chunks, and a
    forwarder splits its list as received."""
    async with group(size) as members:
        failed = {}
        for seed in range(8):
            duplicates = await restart_and_notify(members, seed)
            if any(duplicates):
                failed[seed] = duplicates
        assert failed == {}


@on_both_loops
async def test_a_node_alone_sends_no_join_until_it_has_members() -> None:
    """Without members (nor multicast) a broadcast goes nowhere: it takes no join along.
    Before, each one made a join of its own (a sequence number, an envelope) for nobody.
    Its join still goes with its first broadcast once it has members."""
    async with group(1) as (b,):
        port = free_port()
        await previous_life(NetID("127.0.0.1", port), b)
        alone = Member()
        await alone.start(port=port)
        try:
            first = await alone.node.notify("chat", "nobody")
            assert await alone.node.notify("chat", "nobody again") == first + 1
            alone.node.add_peer(b.node.netid)
            await alone.node.notify("chat", "new life")
            await wait_for(lambda: len(b.got) == 2 or b.node.stats.duplicates > 0)
            assert b.got[1:] == [("chat", "new life")]
            assert b.node.stats.duplicates == 0
        finally:
            await alone.node.close()

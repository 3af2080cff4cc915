"""Group nodes in one process over real sockets on 127.0.0.1: delivery, typed handlers,
duplicates, skipping failed and slow peers, idle closing, limits, hostile input, learning."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
import xxhash

import rpc
from rpc.group import (
    GroupNode,
    MulticastConfig,
    NetID,
    PayloadType,
    PayloadTypes,
    TagCollision,
    as_netid,
)
from rpc.group.dispatch import JOIN
from rpc.group.payloads import decode_envelope, encode_envelope
from tests.group_helpers import (
    KEY,
    Member,
    Point,
    RawPeer,
    closed_on,
    frame,
    free_port,
    group,
    in_flight,
    on_both_loops,
    send_raw,
    wait_for,
)
from wire.errors import MalformedMessage
from wire.gossip import BroadcastID, Gossip, encode_frame, payload_tag


class InOrder(random.Random):
    """A generator whose shuffle keeps the order: trees follow the member list exactly."""

    def shuffle(self, x: Any) -> None:  # type: ignore[override]
        return None


# --- delivery -----------------------------------------------------------------------------


@on_both_loops
async def test_every_member_gets_every_kind_of_payload_once() -> None:
    async with group(8) as members:
        a, b, c = members[0].node, members[3].node, members[7].node
        await a.notify("chat", "hello")
        await b.notify("point", {"x": 1, "y": 2})
        await c.notify("blob", b"\x00\xffraw")
        await a.notify("later", [1, None])  # an async handler
        sent = {
            a: [("chat", "hello"), ("later", [1, None])],
            b: [("point", Point(1, 2))],
            c: [("blob", b"\x00\xffraw")],
        }
        everything = [item for items in sent.values() for item in items]

        def expected(m: Member) -> list[tuple[str, Any]]:
            return sorted((i for i in everything if i not in sent.get(m.node, [])), key=repr)

        nodes = [m.node for m in members]
        # every frame sent has arrived: a stray duplicate would have been dispatched by now
        await wait_for(lambda: all(len(m.got) == len(expected(m)) for m in members))
        await wait_for(lambda: in_flight(*nodes) == 0)
        for m in members:
            assert sorted(m.got, key=repr) == expected(m)
        assert a.stats.broadcasts == 2
        assert sum(m.node.stats.duplicates for m in members) == 0
        assert sum(m.node.stats.dispatched for m in members) == 4 * 7


@on_both_loops
async def test_a_duplicate_is_dispatched_once() -> None:
    async with group(1) as (member,):
        node = member.node
        origin, f1, f2 = NetID("10.0.0.1", 1), NetID("10.0.0.2", 2), NetID("10.0.0.3", 3)
        seq = 5000
        first = frame(f1, origin, seq, "chat", "once")
        # the same broadcast again, and through another forwarder (a new BroadcastID)
        await send_raw(node.netid, first, first, frame(f2, origin, seq, "chat", "once"))
        await wait_for(lambda: node.stats.frames_received == 3)
        assert member.got == [("chat", "once")]
        assert node.stats.duplicates == 2
        # the next sequence number, and an older one never seen, are new
        await send_raw(node.netid, frame(f1, origin, seq + 1, "chat", "next"))
        await send_raw(node.netid, frame(f1, origin, seq - 3, "chat", "late"))
        # one older than the window is taken for a duplicate
        old = seq + 1 - node.options.dedup_window
        await send_raw(node.netid, frame(f1, origin, old, "chat", "too old"))
        await wait_for(lambda: node.stats.frames_received == 6)
        assert member.got == [("chat", "once"), ("chat", "next"), ("chat", "late")]
        # another origin with the same seq is a different broadcast
        await send_raw(node.netid, frame(f1, f2, seq, "chat", "other origin"))
        await wait_for(lambda: len(member.got) == 4)


@on_both_loops
async def test_a_duplicate_still_forwards_its_distribution_list() -> None:
    """A sender that skipped a dead node hands its chunk on: the list must not be lost."""
    async with group(2) as (a, b):
        origin, fwd = NetID("10.0.0.1", 1), NetID("10.0.0.2", 2)
        await send_raw(a.node.netid, frame(fwd, origin, 7, "chat", "x"))
        await wait_for(lambda: a.got == [("chat", "x")])
        await send_raw(a.node.netid, frame(fwd, origin, 7, "chat", "x", dist=(b.node.netid,)))
        await wait_for(lambda: b.got == [("chat", "x")])
        assert a.got == [("chat", "x")]
        assert a.node.stats.duplicates == 1


@on_both_loops
async def test_origin_does_not_get_its_own_broadcast_back() -> None:
    async with group(2) as (a, b):
        seq = await a.node.notify("chat", "mine")
        await wait_for(lambda: b.got == [("chat", "mine")])
        # b sends a's broadcast back to a, as a confused forwarder might
        await send_raw(a.node.netid, frame(b.node.netid, a.node.netid, seq, "chat", "mine"))
        await wait_for(lambda: a.node.stats.duplicates == 1)
        assert a.got == []


@on_both_loops
async def test_frames_are_seed_004_gossip() -> None:
    async with RawPeer() as r1, RawPeer() as r2, RawPeer() as r3, group(1, rng=InOrder(1)) as (a,):
        for raw in (r1, r2, r3):
            a.node.add_peer(raw.netid)
        seq = await a.node.notify("point", {"x": 3, "y": 4})
        # a was started without peers: its join goes first, down the same tree
        await wait_for(lambda: len(r1.frames) == 2 and len(r3.frames) == 2)
        for raw in (r1, r3):
            join = raw.frames.pop(0)
            assert join.tag == payload_tag(JOIN)
            assert decode_envelope(join.payload).origin == a.node.netid
        g = r1.frames[0]
        assert g.current.origin == a.node.netid
        assert g.tag == payload_tag("point") == xxhash.xxh32_intdigest(b"point")
        # three targets in order: chunks (r1 -> [r2]) and (r3)
        assert g.distribution == (r2.netid,)
        assert r3.frames[0].distribution == ()
        assert set(g.others) <= {r2.netid, r3.netid}
        envelope = decode_envelope(g.payload)
        assert (envelope.origin, envelope.seq) == (a.node.netid, seq)
        assert envelope.data == b'{"x":3,"y":4}'
        assert r3.frames[0].payload == g.payload
        assert r2.frames == []  # r1 was to forward it; a raw peer does not


# --- failures -----------------------------------------------------------------------------


@on_both_loops
async def test_unreachable_head_is_skipped_for_the_next_node_of_its_chunk() -> None:
    dead = NetID("127.0.0.1", free_port())
    async with group(3, rng=InOrder(1)) as (a, b, c):
        for m in (a, b, c):
            m.node.remove_peer(b.node.netid)
            m.node.remove_peer(c.node.netid)
        # a's list in order [dead, b, c]: chunks (dead -> [b]) and (c)
        for netid in (dead, b.node.netid, c.node.netid):
            a.node.add_peer(netid)
        await a.node.notify("chat", "around the dead")
        await wait_for(lambda: b.got and c.got)
        assert b.got == c.got == [("chat", "around the dead")]
        # a's join went first on the same tree (a was started without peers): it and the
        # broadcast both waited on the link to dead, and both went on to b
        assert a.node.stats.rerouted == 2
        # now marked down: skipped without another connection attempt
        await a.node.notify("chat", "again")
        await wait_for(lambda: len(b.got) == 2 and len(c.got) == 2)
        assert a.node.stats.rerouted == 3
        assert dead not in a.node.queued


@on_both_loops
async def test_peer_that_drops_connections_is_given_up_and_its_chunk_handed_on() -> None:
    async with RawPeer("drop") as dropper, group(3, rng=InOrder(1)) as (a, b, c):
        for netid in (b.node.netid, c.node.netid):
            a.node.remove_peer(netid)
        for netid in (dropper.netid, b.node.netid, c.node.netid):  # (dropper -> [b]), (c)
            a.node.add_peer(netid)
        await a.node.notify("chat", "hi")
        await wait_for(lambda: b.got == [("chat", "hi")])
        assert dropper.accepted >= 1
        # a barrier, handed on to b the same way over the one a -> b connection (in order):
        # anything a still sent b about "hi" arrives before it
        await a.node.notify("chat", "barrier")
        await wait_for(lambda: ("chat", "barrier") in b.got)
        assert a.node.stats.rerouted >= 1
        assert b.got == [("chat", "hi"), ("chat", "barrier")]


@on_both_loops
async def test_slow_peer_queue_is_bounded_and_overflow_goes_to_the_chunk() -> None:
    async with (
        RawPeer("stall") as staller,
        group(3, rng=InOrder(1), max_queue=2, send_timeout=0.3) as (a, b, c),
    ):
        for netid in (b.node.netid, c.node.netid):
            a.node.remove_peer(netid)
        for netid in (staller.netid, b.node.netid, c.node.netid):  # (staller -> [b]), (c)
            a.node.add_peer(netid)
        blob = os.urandom(256 * 1024)  # incompressible: fills socket buffers fast
        peak = 0
        for i in range(80):
            await a.node.notify("blob", blob[:-1] + bytes((i,)))
            peak = max(peak, a.node.queued.get(staller.netid, 0))
            if a.node.stats.rerouted >= 3:  # the staller's (b's or c's too, on a busy machine)
                break
        assert a.node.stats.overflows >= 3
        assert peak <= 2
        # what the staller could not take went to the rest of its chunk
        await wait_for(lambda: len(b.got) == a.node.stats.rerouted)
        assert len(b.got) >= 3


@on_both_loops
async def test_idle_connections_are_closed_and_reopened() -> None:
    async with group(3, idle_timeout=0.2) as (a, b, c):
        await a.node.notify("chat", "one")
        await wait_for(lambda: b.got and c.got)
        assert a.node.connections >= 1
        await wait_for(lambda: sum(m.node.connections for m in (a, b, c)) == 0, timeout=3)
        await a.node.notify("chat", "two")
        await wait_for(lambda: len(b.got) == 2 and len(c.got) == 2)


@on_both_loops
async def test_silent_inbound_connection_is_closed() -> None:
    async with group(1, first_frame_timeout=0.2) as (a,):
        reader, writer = await asyncio.open_connection(*a.node.address)
        async with asyncio.timeout(3):
            assert await reader.read(1) == b""
        writer.close()


# --- limits and hostile input -------------------------------------------------------------


@on_both_loops
async def test_size_limits() -> None:
    async with group(2, max_size=4096) as (a, b):
        with pytest.raises(rpc.PayloadError, match="exceeds max_size"):
            await a.node.notify("blob", bytes(5000))
        big = frame(NetID("10.0.0.1", 1), NetID("10.0.0.1", 1), 1, "blob", os.urandom(8000))
        assert await closed_on(b.node.netid, big)  # refused from the header, connection closed
        assert b.node.stats.protocol_errors == 1
        assert b.got == []
        await a.node.notify("blob", bytes(1000))
        await wait_for(lambda: b.got == [("blob", bytes(1000))])


@on_both_loops
async def test_garbage_wrong_key_and_foreign_payloads() -> None:
    async with group(1) as (a,):
        netid = a.node.netid
        assert await closed_on(netid, b"GET / HTTP/1.0\r\n\r\n")
        wrong = encode_frame(
            Gossip(BroadcastID(netid, 1), tag=payload_tag("chat"), payload=b"x" * 20), b"other"
        )
        assert await closed_on(netid, wrong)
        assert a.node.stats.protocol_errors == 2
        # a well-formed frame whose payload is not our envelope (e.g. the reference's "hello")
        foreign = encode_frame(
            Gossip(BroadcastID(netid, 1), tag=payload_tag("chat"), payload=b"world"), KEY
        )
        await send_raw(netid, foreign)
        await wait_for(lambda: a.node.stats.malformed == 1)
        # JSON that does not fit the handler's type: not dispatched
        await send_raw(netid, frame(netid, NetID("10.0.0.9", 9), 1, "point", {"x": "no"}))
        await wait_for(lambda: a.node.stats.malformed == 2)
        # unknown name: counted, ignored
        await send_raw(netid, frame(netid, NetID("10.0.0.9", 9), 2, "nobody", 1))
        await wait_for(lambda: a.node.stats.unhandled == 1)
        assert a.got == []
        await send_raw(netid, frame(netid, NetID("10.0.0.9", 9), 3, "chat", "still fine"))
        await wait_for(lambda: a.got == [("chat", "still fine")])


@on_both_loops
async def test_inbound_connections_are_bounded() -> None:
    async with group(1, max_connections=2) as (a,):
        streams = [await asyncio.open_connection(*a.node.address) for _ in range(2)]
        await wait_for(lambda: a.node.footprint().inbound == 2)
        reader, writer = await asyncio.open_connection(*a.node.address)
        async with asyncio.timeout(2):
            assert await reader.read(1) == b""
        for _, w in [*streams, (reader, writer)]:
            w.close()


@on_both_loops
async def test_handler_registered_after_start_is_found() -> None:
    async with group(2) as (a, b):
        late: list[int] = []
        b.registry.handle_notification("late-name")(late.append)
        await a.node.notify("late-name", 42)
        await wait_for(lambda: late == [42])


@on_both_loops
async def test_notify_after_close_fails() -> None:
    async with group(1) as (a,):
        await a.node.close()
        with pytest.raises(RuntimeError, match="closed"):
            await a.node.notify("chat", "x")


# --- membership ---------------------------------------------------------------------------


@on_both_loops
async def test_members_learned_from_seeds_and_gossip() -> None:
    seed = Member()
    await seed.start(learn=True)
    others = [Member() for _ in range(4)]
    try:
        for m in others:
            await m.start(peers=[seed.node.netid], learn=True)
        # every join reached the seed
        await wait_for(lambda: len(seed.node.members) == 4)
        await seed.node.notify("chat", "from the seed")
        await wait_for(lambda: all(m.got == [("chat", "from the seed")] for m in others))
        # the seed's gossip named the other members: everyone now knows everyone
        for m in others:
            assert len(m.node.members) == 4, m.node.members
        await others[2].node.notify("chat", "from a leaf")
        rest = [seed, *others[:2], *others[3:]]
        await wait_for(lambda: all(("chat", "from a leaf") in m.got for m in rest))
    finally:
        for m in [seed, *others]:
            await m.node.close()


@on_both_loops
async def test_static_members_and_start_arguments() -> None:
    a = await GroupNode.start("127.0.0.1", 0, key=KEY, peers=["127.0.0.1:1", ("127.0.0.1", 2)])
    try:
        assert a.members == (NetID("127.0.0.1", 1), NetID("127.0.0.1", 2))
        a.add_peer(a.netid)  # ourselves: ignored
        assert a.netid not in a.members
    finally:
        await a.close()
    with pytest.raises(ValueError, match="advertise"):
        await GroupNode.start("0.0.0.0", 0, key=KEY)
    with pytest.raises(ValueError):
        await GroupNode.start("127.0.0.1", 0, key=KEY, peers=["nohost"])


# --- payload types ------------------------------------------------------------------------


def test_payload_types_and_envelope() -> None:
    types = PayloadTypes(["chat"])
    assert types.register("chat") == PayloadType("chat", payload_tag("chat"))
    assert types.by_tag(payload_tag("chat")) == types.by_name("chat")
    assert "chat" in types and len(types) == 1
    assert types.by_tag(payload_tag("nope")) is None
    assert payload_tag("hello") == 4211111929  # the reference's tag, from the notes
    # t22690 and t823309 share an xxh32 value: the second name cannot be registered
    assert payload_tag("t22690") == payload_tag("t823309")
    types.register("t22690")
    with pytest.raises(TagCollision):
        types.register("t823309")
    assert types.names() == ["chat", "t22690"]
    origin = NetID("192.168.1.2", 29999)
    env = decode_envelope(encode_envelope(origin, 2**40, {"a": 1}))
    assert (env.origin, env.seq, env.data) == (origin, 2**40, b'{"a":1}')
    assert decode_envelope(encode_envelope(origin, 0, b"raw")).data == b"raw"
    for bad in (b"", b"\x02" + bytes(10), b"\x01\x00"):
        with pytest.raises(MalformedMessage):
            decode_envelope(bad)


def test_config_validation() -> None:
    assert as_netid("10.1.2.3:29999") == NetID("10.1.2.3", 29999)
    assert as_netid(("10.1.2.3", 1)) == NetID("10.1.2.3", 1)
    for bad in ("10.1.2.3", "host:1", "10.1.2.3:x", "::1:5"):
        with pytest.raises(ValueError):
            as_netid(bad)
    assert MulticastConfig().group == "224.1.1.1" and MulticastConfig().port == 29999
    with pytest.raises(ValueError, match="multicast group"):
        MulticastConfig(group="10.0.0.1")
    with pytest.raises(ValueError, match="TTL"):
        MulticastConfig(ttl=300)
    with pytest.raises(ValueError, match="max_datagram"):
        MulticastConfig(max_datagram=70000)

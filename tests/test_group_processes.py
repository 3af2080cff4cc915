"""Group nodes as separate processes on 127.0.0.1: sixteen of them, where every broadcast
reaches everyone exactly once and a killed node in the middle of the tree does not cut off
its chunk; and a member killed and restarted (asyncio and uvloop) that rejoins the group."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.peers.group_node import Cluster, NodeProcess

N = 16

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    cluster = await Cluster.start(N, seed=1000)
    try:
        yield cluster
    finally:
        await cluster.stop()


def _values(node: NodeProcess, tag: str) -> Counter[int]:
    return Counter(v["i"] for v in node.received if v["tag"] == tag)


async def _broadcast_and_wait(
    cluster: Cluster, origin: NodeProcess, tag: str, count: int, timeout: float = 10.0
) -> list[NodeProcess]:
    """Broadcast ``count`` values from ``origin``; return the live receivers once all have them."""
    receivers = [n for n in cluster.alive if n is not origin]
    await origin.command(cmd="notify", values=[{"tag": tag, "i": i} for i in range(count)])
    done = await cluster.wait_until(
        lambda: all(len(_values(n, tag)) == count for n in receivers), timeout
    )
    missing = {n.index: count - len(_values(n, tag)) for n in receivers}
    assert done, f"{tag}: messages missing per node: {missing}"
    return receivers


async def _first_copies(cluster: Cluster, broadcasts: int, timeout: float = 10.0) -> None:
    """Wait until each of the ``broadcasts`` broadcasts sent so far (joins included) has
    reached every live node but its origin: frames received, less duplicates, sum to that.
    Polls the stats: a join dispatches nothing, so no event tells of it."""
    want = (len(cluster.alive) - 1) * broadcasts
    async with asyncio.timeout(timeout):
        while True:
            stats = await cluster.stats()
            if sum(s["frames_received"] - s["duplicates"] for s in stats) >= want:
                return
            await asyncio.sleep(0.01)


async def test_every_process_receives_every_broadcast_once(cluster: Cluster) -> None:
    for origin in (0, 7, 15):
        sender = cluster.nodes[origin]
        receivers = await _broadcast_and_wait(cluster, sender, f"single-{origin}", 1)
        assert _values(sender, f"single-{origin}") == Counter()  # no echo to the origin
    # a burst: frames batch and overlap in the tree. The nodes were started without peers,
    # so each origin's join went before its first broadcast, down another tree: wait for
    # every node to have all three joins and singles, or a late forward of a join by node
    # 3 would count among its burst's frames
    await _first_copies(cluster, 3 * 2)
    before = (await cluster.stats())[3]
    receivers = await _broadcast_and_wait(cluster, cluster.nodes[3], "burst", 200)
    stats = await cluster.stats()  # a round trip to every node: late duplicates have arrived
    for node in receivers:
        assert _values(node, "burst") == Counter(range(200)), f"node {node.index}"
        for origin in (0, 7, 15):
            if node.index != origin:
                assert _values(node, f"single-{origin}") == Counter({0: 1}), f"node {node.index}"
    # the tree, not the origin, did the work: at most ceil(log2 16) = 4 frames per broadcast,
    # node 3's join (not counted in broadcasts) one of them
    assert stats[3]["broadcasts"] - before["broadcasts"] == 200
    assert 0 < stats[3]["frames_sent"] - before["frames_sent"] <= 4 * (200 + 1)
    assert sum(s["frames_sent"] for s in stats) >= (N - 1) * (200 + 3 + 4)  # and 4 joins
    assert all(s["protocol_errors"] == 0 and s["dropped"] == 0 for s in stats)


async def test_killed_middle_node_does_not_stop_its_chunk(cluster: Cluster) -> None:
    origin = cluster.nodes[0]
    await _broadcast_and_wait(cluster, origin, "before", 1)  # connections to the victim exist
    victim = cluster.nodes[9]
    await victim.kill()
    # One broadcast at a time: in about half of them the victim heads a chunk of several
    # nodes; the rest of that chunk must still get every message, and only once.
    for i in range(20):
        receivers = [n for n in cluster.alive if n is not origin]
        await origin.command(cmd="notify", values=[{"tag": "after", "i": i}])
        done = await cluster.wait_until(
            lambda i=i, receivers=receivers: all(i in _values(n, "after") for n in receivers),
            10.0,
        )
        missed = [n.index for n in receivers if i not in _values(n, "after")]
        assert done, f"broadcast {i} missed nodes {missed}"
    await _broadcast_and_wait(cluster, cluster.nodes[4], "other-origin", 5)
    stats = await cluster.stats()
    for node in cluster.alive:
        if node is not origin:
            assert _values(node, "after") == Counter(range(20)), f"node {node.index}"
    assert len(stats) == N - 1
    # the victim's chunks really were handed on (it was a chunk head with a rest)
    assert sum(s["rerouted"] for s in stats) > 0
    assert sum(s["skipped"] for s in stats) > 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_killed_and_restarted_member_rejoins(loop: str) -> None:
    # A back-off far longer than the test: only the restarted node's join can bring it back.
    args = ["--loop", loop, "--retry-base", "60", "--retry-after", "60"]
    cluster = await Cluster.start(6, seed=2000, args=args)
    try:
        origin = cluster.nodes[0]
        await _broadcast_and_wait(cluster, origin, "up", 3)
        victim = cluster.nodes[4]
        port = victim.port
        await victim.kill()
        await _broadcast_and_wait(cluster, origin, "down", 3)  # its chunks handed on
        # the members that tried it have backed off from it
        assert any(s["backed_off"] for s in await cluster.stats())
        peers = ",".join(n.address for n in cluster.alive)
        again = await cluster.restart(4, ["--port", str(port), "--peers", peers, *args])
        # its join reaches every member: nobody backs off from it any more
        async with asyncio.timeout(10):
            while any(s["backed_off"] for s in await cluster.stats()):
                await asyncio.sleep(0.02)  # pacing the polls; the loop ends on the condition
        receivers = await _broadcast_and_wait(cluster, origin, "back", 3)
        assert again in receivers
        assert _values(again, "back") == Counter(range(3))
        assert _values(again, "down") == Counter()  # nothing of its absence was kept for it
        await _broadcast_and_wait(cluster, again, "from-again", 3)
        stats = await cluster.stats()
        assert all(s["protocol_errors"] == 0 for s in stats)
    finally:
        await cluster.stop()

"""A forwarder names its own ``max_others`` members in the frames it builds: with more of
them than the sender counted on, a payload at the size limit must still reach the rest of
the chunk, in a frame within ``max_size``."""

from __future__ import annotations

import os

import rpc
from rpc.group import NetID
from tests.group_helpers import Member, group, on_both_loops, wait_for

MAX_SIZE = 8192


@on_both_loops
async def test_forwarder_with_more_others_still_forwards_a_payload_at_the_limit() -> None:
    # Three receivers, each naming up to 64 of its 100 members in a frame; the sender names
    # none, so notify leaves room for its own fields only. Whichever receiver heads the
    # two-node chunk forwards to the other: 64 others (about 450 bytes) took that frame
    # over max_size, and the forwarder dropped it ("frame not sent"): one receiver never
    # got it.
    strangers = [NetID(f"192.0.2.{i}", 7000) for i in range(1, 101)]
    async with group(3, max_size=MAX_SIZE, max_others=64) as receivers:
        for r in receivers:
            for stranger in strangers:  # named in frames, never contacted (learn is off)
                r.node.add_peer(stranger)
        sender = Member()
        await sender.start(max_size=MAX_SIZE, max_others=0)
        try:
            for r in receivers:
                sender.node.add_peer(r.node.netid)
            size = MAX_SIZE
            while True:  # the largest random payload notify takes: the frame at the limit
                blob = os.urandom(size)
                try:
                    await sender.node.notify("blob", blob)
                    break
                except rpc.PayloadError:
                    size -= 8
            assert size > MAX_SIZE - 512
            nodes = [r.node for r in receivers]
            await wait_for(
                lambda: all(r.got for r in receivers) or any(n.stats.dropped for n in nodes)
            )
            assert [r.got == [("blob", blob)] for r in receivers] == [True] * 3
            assert [n.stats.dropped for n in nodes] == [0, 0, 0]
            assert [n.stats.protocol_errors for n in nodes] == [0, 0, 0]  # within max_size
        finally:
            await sender.node.close()

"""Group node defects found by hunting: what ``notify`` lets through must fit a frame; a
member restarted with its clock set back is heard again after its join."""

from __future__ import annotations

import os
import time

import pytest

import rpc
from rpc.group import NetID
from tests.group_helpers import (
    Member,
    frame,
    free_port,
    group,
    on_both_loops,
    send_raw,
    wait_for,
)


@on_both_loops
async def test_incompressible_payload_just_under_max_size_is_refused_not_dropped() -> None:
    # Snappy grows random bytes (about 390 bytes for 8 MiB): a payload that passed notify's
    # check by less than that made a frame over max_size, which the link then dropped with
    # a warning while notify had returned as if it were sent.
    async with group(2, max_size=8 << 20) as (a, b):
        limit = a.node.options.max_size
        with pytest.raises(rpc.PayloadError, match="exceeds max_size"):
            await a.node.notify("blob", os.urandom(limit - 300))
        fits = os.urandom(limit - 4096)
        await a.node.notify("blob", fits)
        await wait_for(lambda: b.got or a.node.stats.dropped)
        assert a.node.stats.dropped == 0
        assert b.got == [("blob", fits)]


@on_both_loops
async def test_member_restarted_with_its_clock_set_back_is_heard_after_its_join() -> None:
    # Sequence numbers start at the clock (microseconds). A node's previous life, whose
    # clock ran an hour ahead (a reboot before NTP stepped it back), left members with a
    # window far above the new life's numbers: they took every new broadcast for an old
    # duplicate. Its join now starts a new window.
    async with group(1) as (b,):
        port = free_port()
        me = NetID("127.0.0.1", port)
        ahead = time.time_ns() // 1000 + 3600 * 10**6
        await send_raw(b.node.netid, frame(me, me, ahead, "chat", "previous life"))
        await wait_for(lambda: b.got == [("chat", "previous life")])
        restarted = Member()
        await restarted.start([b.node.netid], port=port)
        try:
            await restarted.node.notify("chat", "new life")
            await wait_for(lambda: len(b.got) == 2 or b.node.stats.duplicates > 0)
            assert b.got[1:] == [("chat", "new life")]
            assert b.node.stats.duplicates == 0
        finally:
            await restarted.node.close()

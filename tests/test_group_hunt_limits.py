"""Group node limits found by hunting: what ``notify`` lets through must fit a frame."""

from __future__ import annotations

import os

import pytest

import rpc
from tests.group_helpers import group, on_both_loops, wait_for


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

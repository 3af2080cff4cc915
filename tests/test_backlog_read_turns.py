"""While our output waits and the peer's requests are kept, a connection is read once per
loop iteration on either loop: asyncio reads a socket once per iteration, uvloop (libuv) up
to 32 times, so 100 connections flooding a server on uvloop held its loop up to 1 s at a
time while their backlogs filled (an honest client slow for 74% of the fill, 13% now).
Real sockets on 127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import rpc
from rpc.backlog import KEPT_READ_SIZE
from tests.rpc_helpers import wait_until
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request

pytestmark = pytest.mark.both_loops

FLOOD = 6_000


def _registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("big")
    def big(value: Any) -> Any:
        return "x" * (8 << 20)  # far above high_water and what the sockets buffer

    @reg.handle("work")
    def work(value: Any) -> Any:
        return value

    return reg


async def test_a_kept_flood_is_read_once_per_loop_iteration() -> None:
    tiny = [encode(Request(i.to_bytes(4, "big"), "work", b"0")) for i in range(2, 3 + FLOOD)]
    per_read = KEPT_READ_SIZE // len(tiny[0]) + 1
    loop = asyncio.get_running_loop()
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=_registry()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        try:
            writer.write(b"01")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"01"
            writer.write(encode(Request((1).to_bytes(4, "big"), "work", b"1")))
            writer.write(encode(Request((0).to_bytes(4, "big"), "big", b"0")))
            await wait_until(lambda: any(p.outbox.blocked for p in server.peers), 5)
            [served] = server.peers
            kept = served._kept
            writer.write(tiny[0])  # kept: from now on reads are KEPT_READ_SIZE
            await wait_until(lambda: len(kept.messages) == 1, 5)
            sizes = [1]  # before the flood

            def sample() -> None:  # once per loop iteration
                sizes.append(len(kept.messages))
                if len(kept.messages) <= FLOOD:
                    loop.call_soon(sample)

            loop.call_soon(sample)
            writer.write(b"".join(tiny[1:]))
            await wait_until(lambda: len(kept.messages) == FLOOD + 1, 10)
            growth = max(b - a for a, b in itertools.pairwise([*sizes, len(kept.messages)]))
            assert 0 < growth <= 2 * per_read, (growth, per_read)  # before, on uvloop: 32 reads
        finally:
            writer.close()

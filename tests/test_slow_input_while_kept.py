"""A peer that blocks our output, has a request kept and then trickles a message a byte at
a time is closed by ``min_receive_rate`` after its grace: while our output waits it is
still read, and nothing resumes the stall's count. Review 215 wrote this against 0961965
(a pause and resume per read while messages were kept, which restarted the count at every
check; reverted). Real sockets on 127.0.0.1; the waits are bounded, none is a fixed
sleep."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import gotalk_connection, wait_until
from wire import gotalk
from wire.gotalk.encoding import encode
from wire.gotalk.messages import Request

pytestmark = pytest.mark.both_loops

STRICT = rpc.Options(min_receive_rate=1000.0, receive_grace=0.3)
"""Closed after 0.3 s under 1,000 bytes a second."""


def _registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("big")
    def big(value: Any) -> Any:
        return "x" * (8 << 20)  # far above high_water and what the sockets buffer

    reg.handle("echo")(lambda value: value)
    return reg


async def _trickle(writer: asyncio.StreamWriter) -> None:
    """One byte every 50 ms (20 bytes a second), for as long as it is let."""
    while not writer.transport.is_closing():
        writer.write(b"x")
        await asyncio.sleep(0.05)  # the attacker's pace (not a wait for anything)


async def test_a_trickling_peer_with_kept_requests_is_closed_while_our_output_waits() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=_registry(), options=STRICT
    ) as server:
        dripping: asyncio.Future[None] | None = None
        async with gotalk_connection(server.url.port) as (_reader, writer):
            try:
                writer.write(encode(Request((0).to_bytes(4, "big"), "big", b"0")))
                await wait_until(lambda: any(p.outbox.blocked for p in server.peers), 5)
                [served] = server.peers
                writer.write(encode(Request((1).to_bytes(4, "big"), "echo", b"1")))
                await wait_until(lambda: len(served._kept.messages) == 1, 5)  # kept
                header = gotalk.request_header(gotalk.MessageType.REQUEST, b"0002", "echo", 1000)
                writer.write(header + b'"')  # a message begun, its rest a byte at a time
                dripping = asyncio.ensure_future(_trickle(writer))
                # closed after the 0.3-s grace (and a 50-ms confirmation); never with 0961965's
                # pause per read (reverted), whose resumes restarted the count
                await wait_until(lambda: not server.peers, 1.5)
            finally:
                if dripping is not None:
                    dripping.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await dripping

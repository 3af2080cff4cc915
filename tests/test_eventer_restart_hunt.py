"""The Eventer server and client under deployment conditions (found by helper-156): a server
that closes (a restart) under a client that does not reconnect, and a subscriber that does
not ack while events flood."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rpc import eventer
from rpc.eventer import EventerServer, common
from tests.peers.eventer_helpers import (
    json_event,
    server_config,
    url_of,
    wait_until,
)

# --- a server that closes under its client ------------------------------------------------


async def test_what_the_client_received_before_its_server_closed_is_still_delivered(
    tmp_path: Path,
) -> None:
    """A client without ``reconnect`` whose server closes (a restart, SIGTERM) hands every
    notification it had received to its callback and iterators, in order, and only then
    ends the iterators, as hat's client does (it calls back before reading on). Its
    delivery task was cancelled when the connection closed: the callback running was
    cancelled, the notifications queued behind it were dropped, and the iterators ended
    without them (nothing said so)."""
    server = await EventerServer(server_config(tmp_path)).start()
    release = asyncio.Event()
    delivered: list[common.EventType] = []
    statuses: list[eventer.Status] = []

    async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
        await release.wait()
        delivered.extend(e.type for e in events)

    try:
        client = await eventer.connect(
            url_of(server),
            "reader",
            subscriptions=[("n", "*")],
            events_cb=slow_cb,
            status_cb=lambda _c, status: statuses.append(status),
        )
        stream = client.events()
        for i in range(3):
            await server.register([json_event(("n", str(i)))])
        await wait_until(lambda: client._deliveries.qsize() == 2)  # ("n", "0") in slow_cb
    finally:
        await server.close()
    await asyncio.wait_for(client.closed, 5)
    release.set()

    async def read_all() -> list[list[common.EventType]]:
        return [[e.type for e in events] async for events in stream]

    expected = [("n", "0"), ("n", "1"), ("n", "2")]
    assert await asyncio.wait_for(read_all(), 5) == [[t] for t in expected]
    assert delivered == expected
    S = eventer.Status
    assert statuses == [S.OPERATIONAL, S.STOPPING, S.STANDBY]
    await client.close()

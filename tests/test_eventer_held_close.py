"""A server's close seen by our Eventer client while it holds the server's input (its
deliveries full: an ``events()`` iterator not read, a slow ``events_cb``), over real sockets
on 127.0.0.1 against our Eventer server (:mod:`rpc.eventer.hold_watch`).

A transport whose reading is paused hears nothing of its socket: before dd32f6f, the client
went on calling itself connected, and a query waited, until the second of the Pings it sends
while holding (one every ``ping_timeout / 2``, 10 s) failed to go out. Now the loop watches
the socket, unread, while the client holds: at the server's FIN the client stops holding and
reads the rest (nothing comes after it: at most the receive buffer), delivering it, answers
included; a reset aborts the connection. A FIN that our closed window keeps in the server's
host comes out as a reset on those Pings. On asyncio and uvloop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer.common import EventPayloadBinary, QueryLatestParams, RegisterEvent, Status
from tests.peers.eventer_helpers import json_event, running_server, url_of, wait_until

pytestmark = pytest.mark.both_loops


def peer_of(client: eventer.Client) -> rpc.Peer:
    conn = client.connection
    peer = conn.connection if conn is not None else None
    assert peer is not None
    return peer


def reading(client: eventer.Client) -> bool:
    transport = peer_of(client).transport
    return transport is not None and bool(transport.is_reading())


async def held_after(
    server: eventer.EventerServer, client: eventer.Client, group: str, count: int
) -> None:
    """Register ``count`` events of ``group`` and wait until the client holds the server's
    input (its deliveries full: nothing more is read)."""
    for i in range(count):
        await server.register([json_event((group, str(i)), i)])
    await wait_until(lambda: not reading(client))


async def test_a_server_close_is_seen_while_an_unread_iterator_holds_the_input(
    tmp_path: Path,
) -> None:
    """The server closes gracefully (its FIN reaches us behind notifications not read):
    the client stops holding, reads the rest and closes within a bound; the query waiting
    on it gets the answer the server sent before its FIN (dd32f6f and 73d7d0a aborted at
    the FIN: it failed with ``rpc.ConnectionClosed``, the answer dropped unread); later
    calls fail; and the iterator yields all 8 lists, in order, then ends."""
    async with running_server(tmp_path, system_events=False) as server:
        client = await eventer.connect(
            url_of(server), "held", subscriptions=[("h", "*")], events_queue_size=1
        )
        try:
            iterator = client.events()  # read only once the server is gone
            await held_after(server, client, "h", 8)
            peer = peer_of(client)
            pending = asyncio.create_task(client.query(QueryLatestParams([("h", "*")])))
            await wait_until(peer.calls_waited_for)  # sent: its answer waits unread
            await server.close()  # its FIN comes behind what we have not read
            async with asyncio.timeout(1):  # at the FIN (before dd32f6f: a Ping, 20 s on)
                await asyncio.shield(client.closed)
            assert not client.is_connected
            async with asyncio.timeout(3):
                result = await pending  # answered before the server's FIN: read, not dropped
            assert sorted(e.type[1] for e in result.events) == [str(i) for i in range(8)]
            with pytest.raises(rpc.ConnectionClosed):
                await client.query(QueryLatestParams([("h", "*")]))
            async with asyncio.timeout(3):
                got = [e.type[1] async for events in iterator for e in events]
            assert got == [str(i) for i in range(8)]
        finally:
            await client.close()


async def test_a_graceful_server_close_during_a_short_hold_loses_nothing(tmp_path: Path) -> None:
    """A slow ``events_cb`` holds the input for a moment while the server closes gracefully
    (``EventerServer.close()``: STOPPING, STANDBY, then the connection): the client reads
    what is left behind the FIN without waiting for room (``closed`` resolves while the
    callback still waits), and every notification, the statuses too, is delivered in order
    once the callback returns, as hat's client delivers them. dd32f6f and 73d7d0a aborted
    at the FIN and dropped them (found by review 185): ``stopping`` never reached the
    client, against docs/eventer.md."""
    release = asyncio.Event()
    delivered: list[str] = []
    statuses: list[Status] = []

    async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
        await release.wait()
        delivered.extend(e.type[1] for e in events)

    def status_cb(_client: eventer.Client, status: Status) -> None:
        statuses.append(status)

    async with running_server(tmp_path, system_events=False) as server:
        client = await eventer.connect(
            url_of(server),
            "short-hold",
            subscriptions=[("g", "*")],
            events_cb=slow_cb,
            status_cb=status_cb,
            events_queue_size=1,
        )
        try:
            await held_after(server, client, "g", 6)
            async with asyncio.timeout(5):
                await server.close()  # STOPPING, STANDBY, then the connection closes
            async with asyncio.timeout(1):  # the rest read without room: the callback waits
                await asyncio.shield(client.closed)
            assert not release.is_set() and not client.is_connected
            release.set()  # the callback returns: what was read is delivered
        finally:
            release.set()
            await client.close()  # waits for what was received to be delivered
    assert delivered == [str(i) for i in range(6)]
    assert statuses == [Status.OPERATIONAL, Status.STOPPING, Status.STANDBY], statuses


async def test_a_reconnecting_client_does_not_keep_the_connection_it_read_out(
    tmp_path: Path,
) -> None:
    """A reconnecting client read out at its server's FIN during a hold (the server then
    gone): the connection's peer is not kept once that connection has ended, though the
    client lives on to reconnect. Before (review 194), it was kept until the next FIN or the
    client's close."""
    release = asyncio.Event()

    async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
        await release.wait()

    async with running_server(tmp_path, system_events=False) as server:
        client = await eventer.connect(
            url_of(server),
            "read-out",
            subscriptions=[("g", "*")],
            events_cb=slow_cb,
            events_queue_size=1,
            reconnect=True,
            reconnect_delay=0.05,
        )
        try:
            await held_after(server, client, "g", 4)
            old = peer_of(client)
            async with asyncio.timeout(5):
                await server.close()
            await asyncio.wait_for(asyncio.shield(old.closed), 2)
            await wait_until(lambda: client._deliveries._read_out is None, 2)
        finally:
            release.set()
            await client.close()


async def test_a_server_that_cuts_the_held_client_off_is_seen_on_its_pings(
    tmp_path: Path,
) -> None:
    """A slow ``events_cb`` holds the input while notifications flood in; the server cuts
    the connection off (``abort()``, as it gives up on a client past
    ``max_client_backlog``) with bytes we have not taken: its FIN waits in the server's host
    behind our closed window (checked by hand: the Ping draws the reset), and nothing
    reaches us. The client's Pings, every
    ``ping_timeout / 2`` while it holds, draw the reset: the close is seen within
    ``ping_timeout / 2`` and a round trip, as the reset arrives; nothing more is read
    meanwhile, and the notifications received before are delivered once the callback
    returns."""
    release = asyncio.Event()
    delivered: list[str] = []

    async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
        await release.wait()
        delivered.extend(e.type[1] for e in events)

    payload = EventPayloadBinary("b", b"x" * 1000)
    async with running_server(tmp_path, system_events=False) as server:
        client = await eventer.connect(
            url_of(server),
            "slow",
            subscriptions=[("f", "*")],
            events_cb=slow_cb,
            events_queue_size=4,
            ping_timeout=0.5,
        )
        try:
            for i in range(200):  # 200 KB: more than our socket buffer takes
                await server.register([RegisterEvent(("f", str(i)), None, payload)])
            await wait_until(lambda: not reading(client))
            held = client.queued_bytes
            [info] = server.clients
            info.peer.abort()  # what the server does to a client that reads too slowly
            async with asyncio.timeout(1):  # a Ping in 0.25 s (before dd32f6f: 20 s, the default)
                await asyncio.shield(client.closed)
            assert not client.is_connected
            assert client.queued_bytes == held <= 5 * 1100  # nothing more was read
        finally:
            release.set()
            await client.close()
    assert delivered, "nothing was received before the close"
    assert delivered == [str(i) for i in range(len(delivered))]

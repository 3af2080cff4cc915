"""Our Eventer server's bounds on the memory one client can make it hold: the answers to
queries it does not read, the notifications it does not ack, the registrations it sends
faster than the disk takes them, and the system events its name goes into."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import MSG_INIT_REQ, MSG_INIT_RES, MSG_QUERY_REQ, MSG_QUERY_RES
from tests.chatter_socket import ChatterSocket
from tests.peers.eventer_helpers import (
    init_bytes,
    json_event,
    port_of,
    running_server,
    url_of,
    wait_until,
)
from wire.chatter import Dialect


async def _initialised_socket(port: int, name: str, subs: list[tuple[str, ...]]) -> ChatterSocket:
    """A bare Chatter socket, initialised, that reads only when told to."""
    sock = await ChatterSocket.connect("127.0.0.1", port, Dialect.CURRENT)
    sock.conn.send(MSG_INIT_REQ, init_bytes(name, subs=subs), last=False)
    sock.flush()
    assert (await sock.receive()).type == MSG_INIT_RES
    return sock


async def test_queries_of_a_client_that_reads_nothing_wait_for_it_to_read(tmp_path: Path) -> None:
    """All the queries of one read used to run at once, each result waiting in memory for
    the client to read: 1,000 latest queries (35 kB sent) for a 1 MiB result made the
    server hold 1.2 GiB. Now a connection's queries run one at a time, once its output
    is taken: those answered after a new event is registered see it."""
    size, count = 2 << 20, 24
    big = common.QueryLatestParams([("big",)])
    # ":memory:": one thread runs the commits and the queries, in the order they come
    overrides = {"database": ":memory:", "sync": "full", "system_events": False}
    async with running_server(tmp_path, **overrides) as server:
        async with await eventer.connect(url_of(server), "writer") as writer:
            assert await writer.register([json_event(("big",), "x" * size)], with_response=True)
            hog = await _initialised_socket(port_of(server), "hog", [])
            [client] = [c for c in server.clients if c.name == "hog"]
            query = common.encode(MSG_QUERY_REQ, common.query_params_to_sbs(big))
            for _ in range(count):
                hog.conn.send(MSG_QUERY_REQ, query, last=False)
            hog.flush()  # one write of 24 x 35 bytes: one read, all dispatched together
            await wait_until(lambda: client.peer.handlers_running > 0)
            # queries of our own, after those the server started for the hog: once they
            # ran (twice, a started job's query may come one turn later), so had those
            for _ in range(3):
                assert len((await server.query(big)).events) == 1
            assert await writer.register([json_event(("big",), "new")], with_response=True)
            replies = [await hog.receive(timeout=10) for _ in range(count)]
            await hog.close()
    assert [r.type for r in replies] == [MSG_QUERY_RES] * count
    made_before = sum(len(r.data) > size for r in replies)  # the rest: after "new"
    assert 1 <= made_before <= count // 3, made_before


async def test_a_client_that_does_not_ack_is_closed_past_max_client_backlog(
    tmp_path: Path,
) -> None:
    """With ``events_ack``, what waited for a client's acks was bounded in count alone
    (10,000 notifications, of up to 16 MiB each) until ``ack_timeout``: 1,500 events of
    200 kB grew the server by 280 MiB more for one client that never acked."""
    backlog = 256 * 1024
    config = {"events_ack": True, "max_client_backlog": backlog, "system_events": False}
    async with running_server(tmp_path, **config) as server:
        mute = await _initialised_socket(port_of(server), "mute", [("*",)])
        got: list[common.EventType] = []
        async with (
            await eventer.connect(
                url_of(server),
                "acks",
                subscriptions=[("*",)],
                events_cb=lambda _, events: got.extend(e.type for e in events),
            ),
            await eventer.connect(url_of(server), "writer") as writer,
        ):
            for i in range(32):  # 1 MiB of notifications, well within ack_timeout (30 s)
                event = json_event(("big", str(i)), "x" * (backlog // 8))
                assert await writer.register([event], with_response=True) is not None
                await wait_until(lambda n=i + 1: len(got) == n)  # the one that acks keeps up
            await wait_until(lambda: "mute" not in [c.name for c in server.clients])
            assert got == [("big", str(i)) for i in range(32)]  # and stays
            assert sorted(c.name for c in server.clients) == ["acks", "writer"]
        await mute.close()


async def test_registrations_past_max_pending_bytes_fail_until_the_disk_catches_up(
    tmp_path: Path,
) -> None:
    """Waiting registrations were bounded in count alone (500,000 events): 400 of 4 MiB
    sent without response grew the server by 1.46 GiB. Registrations submitted together
    wait for one commit: past ``max_pending_bytes`` of them, the others fail."""
    limit, size = 1 << 20, 1 << 18
    async with running_server(tmp_path, max_pending_bytes=limit, system_events=False) as server:
        events = [[json_event(("big", str(i)), "x" * size)] for i in range(16)]
        results = await asyncio.gather(*(server.register(e) for e in events))
        accepted = [i for i, r in enumerate(results) if r is not None]
        assert accepted == [0, 1, 2, 3]  # over 1 MiB after 4, the 5th and later refused
        async with await eventer.connect(url_of(server), "c") as client:
            for i in (4, 5):  # committed now: registrations go on, by request or not
                assert await client.register(events[i], with_response=True) is not None
            assert await client.register(events[6]) is None  # sent, nothing answered
            result = await client.query(common.QueryLatestParams([("big", "*")]))
            assert sorted(e.type[1] for e in result.events) == ["0", "1", "2", "3", "4", "5", "6"]


async def test_a_name_too_long_for_its_system_events_is_refused_in_the_init_response(
    tmp_path: Path,
) -> None:
    """Such an init was answered with a PeerwireRpc.Error, which hat's client cannot
    decode: the CONNECTED event with the name in its type did not fit in a message."""
    size = 1 << 16
    async with running_server(tmp_path, max_message_size=size) as server:
        with pytest.raises(eventer.EventerInitError, match="client name of 65336 bytes"):
            await eventer.connect(url_of(server), "n" * (size - 200), max_size=size)
        name = "n" * (size - 800)  # fits: connected, then its DISCONNECTED registered
        await (await eventer.connect(url_of(server), name, max_size=size)).close()
        await wait_until(lambda: not server.clients)
        # removed and DISCONNECTED registered in one callback: the query waits for it
        latest = await server.query(common.QueryLatestParams([("event", "1", "eventer", name)]))
        assert [e.payload for e in latest.events] == [common.EventPayloadJson("DISCONNECTED")]

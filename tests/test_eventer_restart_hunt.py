"""The Eventer server and client under deployment conditions (found by helper-156 and
helper-157): a server that closes (a restart, SIGTERM) under a client that does not reconnect
or that goes away meanwhile, a subscriber that does not ack while events flood, an
``events()`` reader that queries, and a callback that closes its client (with acks, from a
status callback while an events notification is queued, while delivery is full, once the
connection is lost)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer import EventerServer, common
from rpc.eventer.client import EventsIterator, StatusCb
from rpc.eventer.server import STOP_FLUSH_TIMEOUT
from tests.peers.eventer_helpers import (
    init_bytes,
    json_event,
    raw_peer,
    running_server,
    server_config,
    url_of,
    wait_until,
)

# --- helpers ---------------------------------------------------------------------------------


@dataclass
class _Held:
    """A client whose server closed while its slow callback held the first of three
    notifications, the other two queued behind it."""

    client: eventer.Client
    release: asyncio.Event  # lets the callback go on
    delivered: list[common.EventType]  # what the callback got, in order
    stream: EventsIterator | None  # taken before the first notification, if asked


async def _lost_while_held(
    tmp_path: Path, *, stream: bool = False, status_cb: StatusCb | None = None
) -> _Held:
    """Connect a client subscribed to ``("n", "*")`` whose ``events_cb`` waits for
    ``release``, register ("n", "0") to ("n", "2"), then close the server (not reconnected:
    lost for good). ``stream`` also takes ``client.events()`` before the first."""
    server = await EventerServer(server_config(tmp_path)).start()
    release = asyncio.Event()
    delivered: list[common.EventType] = []

    async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
        await release.wait()
        delivered.extend(e.type for e in events)

    try:
        client = await eventer.connect(
            url_of(server),
            "reader",
            subscriptions=[("n", "*")],
            events_cb=slow_cb,
            status_cb=status_cb,
        )
        events = client.events() if stream else None
        for i in range(3):
            await server.register([json_event(("n", str(i)))])
        await wait_until(lambda: client._deliveries.qsize() == 2)  # ("n", "0") in slow_cb
    finally:
        await server.close()
    return _Held(client, release, delivered, events)


async def _never_acking(server: EventerServer, never: asyncio.Event) -> rpc.Peer:
    """A raw peer subscribed to everything as "slow" (for an ``events_ack`` server) whose
    notification handler waits for ``never``, so it acks none while ``never`` is clear."""
    registry = rpc.Registry()

    @registry.handle(common.MSG_EVENTS_NOTIFY)
    async def no_ack(data: bytes) -> None:
        await never.wait()

    slow = await raw_peer(server, registry)
    try:
        await slow.request(common.MSG_INIT_REQ, init_bytes("slow", subs=[("*",)]), raw=True)
    except BaseException:
        await slow.close()
        raise
    return slow


async def _close_timed(client: eventer.Client, took: asyncio.Future[float]) -> None:
    """Close ``client`` and set ``took`` to the seconds that took (also if it raised, so the
    test does not wait out its bound)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        await client.close()
    finally:
        took.set_result(loop.time() - start)


def _assert_closed_at_once(
    client: eventer.Client, caplog: pytest.LogCaptureFixture, waited: float
) -> None:
    """The close from a callback ended well within the 1-s drain: ``closed`` is done, no
    handler was cut (the drain's 'are cut' warning) and it took under 0.5 s."""
    assert client.closed.done()
    cut = [r.getMessage() for r in caplog.records if "are cut" in r.getMessage()]
    assert cut == []
    assert waited < 0.5, waited


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
    statuses: list[eventer.Status] = []
    held = await _lost_while_held(
        tmp_path, stream=True, status_cb=lambda _c, status: statuses.append(status)
    )
    client, stream = held.client, held.stream
    assert stream is not None
    await asyncio.wait_for(client.closed, 5)
    held.release.set()

    async def read_all() -> list[list[common.EventType]]:
        return [[e.type for e in events] async for events in stream]

    expected = [("n", "0"), ("n", "1"), ("n", "2")]
    assert await asyncio.wait_for(read_all(), 5) == [[t] for t in expected]
    assert held.delivered == expected
    S = eventer.Status
    assert statuses == [S.OPERATIONAL, S.STOPPING, S.STANDBY]
    await client.close()


# --- a subscriber that does not ack while events flood -----------------------------------


async def test_closing_waits_no_longer_for_a_client_that_is_gone(tmp_path: Path) -> None:
    """With ``events_ack``, a graceful close gives ack-paced clients up to
    ``STOP_FLUSH_TIMEOUT`` (1 s) to take STOPPING and STANDBY. A client that goes away
    meanwhile (one that did not ack, or that closed just before: a SIGTERM while clients
    leave) has nothing more to take, but its sender stopped without saying it was done, so
    the close waited the whole second for it."""
    server = await EventerServer(server_config(tmp_path, events_ack=True)).start()
    never = asyncio.Event()
    try:
        slow = await _never_acking(server, never)
        await server.register([json_event(("a",))])  # notified, never acked
        closing = asyncio.ensure_future(server.close())
        await wait_until(lambda: server.status is eventer.Status.STANDBY)  # flushing now
        gone = asyncio.get_running_loop().time()
        slow.abort()
        await asyncio.wait_for(closing, 5)
        waited = asyncio.get_running_loop().time() - gone
        assert waited < STOP_FLUSH_TIMEOUT / 2, waited
    finally:
        never.set()
        await server.close()


async def test_a_subscriber_closed_for_its_backlog_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``events_ack``, a client past ``max_client_backlog`` of notifications not acked
    is closed, and that is one warning. Every session of the commit batch that closed it
    (the connection is forgotten only once its close is seen, a loop turn later) logged
    the warning again and aborted it again: 200 registrations read in one go made 199
    lines for one client. The other clients go on."""
    async with running_server(
        tmp_path, events_ack=True, max_client_backlog=16 * 1024, system_events=False
    ) as server:
        never = asyncio.Event()
        slow = await _never_acking(server, never)
        try:
            async with await eventer.connect(url_of(server), "writer") as writer:
                with caplog.at_level(logging.WARNING, logger="peerwire.eventer.server"):
                    for i in range(200):  # sent at once, read and committed together
                        await writer.register([json_event(("a", str(i)), "x" * 1000)])
                    last = await writer.register([json_event(("a", "last"))], with_response=True)
                    await wait_until(lambda: [c.name for c in server.clients] == ["writer"])
                assert last is not None
            lines = [r.getMessage() for r in caplog.records if "keep up" in r.getMessage()]
            assert len(lines) == 1, lines
            assert "'slow'" in lines[0]
        finally:
            never.set()
            await slow.close()


# --- an iterator's reader that queries ----------------------------------------------------


async def test_an_iterator_reader_that_queries_is_answered_past_the_bound(tmp_path: Path) -> None:
    """``async for events in client.events(): await client.query(...)``: while the reader
    waits for its answer, its iterator is full, delivery waits for it, and the connection
    stops reading, the answer behind the notifications it holds. The query waited its
    whole timeout (RequestTimeout at the first list); a callback's own queries were
    answered past the bound, an iterator reader's were not. Now they are, as a callback's,
    and every list still comes, in order."""
    async with running_server(tmp_path, system_events=False) as server:
        reader = await eventer.connect(
            url_of(server), "reader", subscriptions=[("n", "*")], events_queue_size=8, timeout=2
        )
        stream = reader.events()
        async with await eventer.connect(url_of(server), "writer") as writer:
            for i in range(300):
                await writer.register([json_event(("n",), i)])
            await writer.query(eventer.QueryLatestParams([]))  # all notified by now
        connection = reader.connection.connection if reader.connection else None
        assert connection is not None
        await wait_until(lambda: not connection.transport.is_reading())

        async def read_and_query() -> list[object]:
            seen: list[object] = []
            async for events in stream:
                seen.extend(e.payload.data for e in events)  # type: ignore[union-attr]
                latest = await reader.query(eventer.QueryLatestParams([("n",)]))
                assert [e.payload.data for e in latest.events] == [299]  # type: ignore[union-attr]
                if len(seen) == 300:
                    return seen
            return seen

        try:
            assert await asyncio.wait_for(read_and_query(), 10) == list(range(300))
        finally:
            await reader.close()


# --- a callback that closes its client ------------------------------------------------------


async def test_a_callback_that_closes_its_client_with_acks_does_not_wait_for_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``events_ack``, a notification's ack is sent once the callback returned, and the
    client's close drains its connection's handlers, the ack's among them. A callback that
    closed the client (stop at the first event) so waited for itself: the close took the
    whole 1-s drain, then cut the ack's handler with a warning. The close now acks the
    notification being handled (the callback has it), and returns at once."""
    async with running_server(tmp_path, events_ack=True) as server:
        took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def stop_at_first(client: eventer.Client, _events: list[eventer.Event]) -> None:
            await _close_timed(client, took)

        client = await eventer.connect(
            url_of(server), "once", subscriptions=[("a",)], events_cb=stop_at_first
        )
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            await server.register([json_event(("a",))])
            waited = await asyncio.wait_for(took, 5)
        _assert_closed_at_once(client, caplog, waited)


async def test_a_status_callback_that_closes_its_client_does_not_wait_for_a_queued_ack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``events_ack``, a status notification and then an events one (sent without
    waiting: a status needs no ack): a status callback that closes its client (stop once
    the server says so) waited for the queued events' ack handler, which waited for the
    delivery task, which ran that callback: the close took the whole 1-s drain and cut
    the handler with a warning. close() drops what is not delivered: it no longer waits
    for those notifications' acks either."""
    async with running_server(tmp_path, events_ack=True) as server:
        took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def stop_on_status(client: eventer.Client, status: eventer.Status) -> None:
            if status is not eventer.Status.STARTING or took.done():
                return  # the init's, or after the close
            await wait_until(lambda: client._deliveries.qsize() == 2)  # the rest, queued
            await _close_timed(client, took)

        client = await eventer.connect(
            url_of(server), "once", subscriptions=[("a",)], status_cb=stop_on_status
        )
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            await server.set_status(eventer.Status.STARTING)
            await server.set_status(eventer.Status.OPERATIONAL)
            await server.register([json_event(("a",))])
            waited = await asyncio.wait_for(took, 5)
        _assert_closed_at_once(client, caplog, waited)


async def test_a_callback_that_closes_its_client_while_delivery_is_full_does_not_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without acks, past ``events_queue_size`` notifications the connection runs a task
    that waits for room in the deliveries, which the close's drain waits for: a callback
    that closed its client then waited for itself (the delivery task runs it)."""
    async with running_server(tmp_path) as server:
        took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def stop_at_first(client: eventer.Client, _events: list[eventer.Event]) -> None:
            if took.done():
                return
            await wait_until(lambda: not client._deliveries.room.is_set())  # full: held
            await _close_timed(client, took)

        client = await eventer.connect(
            url_of(server),
            "once",
            subscriptions=[("a",)],
            events_cb=stop_at_first,
            events_queue_size=2,
        )
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            for i in range(6):
                await server.register([json_event(("a",), i)])
            waited = await asyncio.wait_for(took, 5)
        _assert_closed_at_once(client, caplog, waited)


async def test_closing_a_client_lost_for_good_delivers_what_it_received_first(
    tmp_path: Path,
) -> None:
    """``async with`` around ``await client.closed``: the exit's ``close()`` waits for the
    notifications the lost connection brought to reach the callback (a slow one here).
    Before, ``closed`` resolved at once and ``close()`` dropped them: the callback got
    the first and was cancelled in it."""
    held = await _lost_while_held(tmp_path)
    async with held.client:
        await asyncio.wait_for(held.client.closed, 5)
        # a callback slower than the close's own steps: released while the exit's close
        # waits (before, the close was over by then and had cancelled the callback)
        asyncio.get_running_loop().call_later(0.2, held.release.set)
    assert held.delivered == [("n", "0"), ("n", "1"), ("n", "2")]


async def test_a_callback_closing_its_lost_client_does_not_wait_for_itself(
    tmp_path: Path,
) -> None:
    """A callback that closes its client once the connection is lost for good closes it at
    once: the deliveries it would wait for include its own."""
    server = await EventerServer(server_config(tmp_path)).start()
    lost = asyncio.Event()
    closed_in: list[float] = []

    async def closing_cb(client: eventer.Client, _events: list[eventer.Event]) -> None:
        await lost.wait()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await client.close()
        closed_in.append(loop.time() - started)

    try:
        client = await eventer.connect(
            url_of(server),
            "closer",
            subscriptions=[("n", "*")],
            events_cb=closing_cb,
            timeout=5,
        )
        await server.register([json_event(("n", "0"))])
        await wait_until(lambda: client._deliveries.qsize() == 0)  # in closing_cb
    finally:
        await server.close()
    await asyncio.wait_for(client.closed, 5)
    lost.set()
    await wait_until(lambda: closed_in != [])
    assert closed_in[0] < 1.0, closed_in

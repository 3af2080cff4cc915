"""A graceful close of our Eventer server under clients that keep it busy, over real sockets
on 127.0.0.1 (our client, hat-event's, a raw Chatter socket).

Limits relied on: ``STOP_FLUSH_TIMEOUT`` (1 s), the most a close waits for ack-paced
clients; ``CLOSE_DRAIN_TIMEOUT`` (1 s), the most it waits for requests in flight; the core's
``high_water`` (256 KiB), the output past which a query waits for the client to read.

- A client that keeps requests in flight (queries, registrations) made the close run to its
  whole drain bound (the core runs every request of a Hat peer during a graceful close and
  waits for it), then cut the requests in flight. Now a query read once the connections
  close is not run nor answered, the requests read before are answered, and each connection
  closes as soon as they are.
- With ``events_ack``, a client that never acks made the close take 2 s: the flush waited
  ``STOP_FLUSH_TIMEOUT`` for its ack, then the connection's drain waited as long again for
  the same notification's request. Now the close waits the one bound, and not at all for a
  client with nothing queued behind an unacknowledged notification.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event import eventer as hat_eventer

import rpc
from rpc import eventer
from rpc.eventer import common
from rpc.eventer.server import CLOSE_DRAIN_TIMEOUT, STOP_FLUSH_TIMEOUT
from tests.chatter_socket import ChatterSocket
from tests.peers.eventer_helpers import (
    json_event,
    port_of,
    running_server,
    server_config,
    url_of,
    wait_until,
)
from wire.chatter import Dialect

CUT = "still running after"
"""The core's warning for handlers and calls a drain cut (logger peerwire.rpc)."""


def _cuts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if CUT in r.getMessage()]


async def _timed_close(server: eventer.EventerServer) -> float:
    """Close ``server`` (within 5 s): the seconds until its connections had closed, the
    flush and drain the tests bound. The service's close that follows (its writer's last
    checkpoint, reader threads, the SQLite store) is waited for but not counted: on a
    loaded machine it alone took up to 0.5 s, and a close whose connections closed in
    time failed the drain's bound (0.92 s for 0.8 s)."""
    loop = asyncio.get_running_loop()
    peers = [peer for each in server.servers for peer in each.peers]
    start = loop.time()
    async with asyncio.timeout(5):
        closing = asyncio.ensure_future(server.close())
        closed = asyncio.gather(*(asyncio.shield(peer.closed) for peer in peers))
        await asyncio.wait([closing, closed], return_when=asyncio.FIRST_COMPLETED)
        took = loop.time() - start
        await closing
        await closed
    return took


# --- requests in flight --------------------------------------------------------------------


async def _raw_client(server: eventer.EventerServer) -> ChatterSocket:
    """A raw Chatter client of ``server``, its session opened (no subscriptions)."""
    sock = await ChatterSocket.connect("127.0.0.1", port_of(server), Dialect.CURRENT)
    init = common.init_req_to_sbs("raw", None, [], None, False)
    sock.conn.send(common.MSG_INIT_REQ, common.encode(common.MSG_INIT_REQ, init), last=False)
    sock.flush()
    assert (await sock.receive()).type == common.MSG_INIT_RES
    return sock


async def _end(
    server: eventer.EventerServer, sock: ChatterSocket, closing: asyncio.Future[Any] | None
) -> None:
    """A raw-client test's end, however it went: the close it began (if it did) awaited,
    then the server and the client closed."""
    if closing is not None:
        await asyncio.gather(asyncio.wait_for(closing, 5), return_exceptions=True)
    await server.close()
    await sock.close()


def _query_bytes() -> bytes:
    params = common.QueryLatestParams([("big", "*")])
    return common.encode(common.MSG_QUERY_REQ, common.query_params_to_sbs(params))


async def test_requests_in_flight_are_answered_later_queries_close_the_connection(
    tmp_path: Path,
) -> None:
    """Five 4 MiB queries sent at once by a client that does not read: the server runs them
    one at a time, each once the client has taken the output below ``high_water``, so they
    are in flight when the server closes. A sixth, sent once it announced STANDBY, is not
    run; once the client reads, the five are answered, and the connection closes right
    after (not at ``CLOSE_DRAIN_TIMEOUT``). Before, the sixth was run and answered too."""
    server = await eventer.EventerServer(server_config(tmp_path, system_events=False)).start()
    closing: asyncio.Task[float] | None = None
    sock = await _raw_client(server)
    try:
        big = "x" * (1 << 20)
        await server.register([json_event(("big", str(i)), big) for i in range(4)])
        sent = [sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False) for _ in range(5)]
        sock.flush()
        await wait_until(lambda: server.clients[0].peer.write_buffer_size > 256 * 1024)

        closing = asyncio.create_task(_timed_close(server))
        # no ack-paced client: the close drains the connections in the step that
        # announces STANDBY, so a query sent once STANDBY shows is read while draining
        await wait_until(lambda: server.status is eventer.Status.STANDBY)
        late = sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False)
        sock.flush()

        answers: dict[int, int] = {}
        statuses: list[Any] = []
        loop = asyncio.get_running_loop()
        with pytest.raises(ConnectionError):  # read until the server closes
            while True:
                msg = await sock.receive(timeout=3)
                if msg.type == common.MSG_QUERY_RES:
                    answers[msg.first] = len(msg.data)
                    answered_at = loop.time()
                elif msg.type == common.MSG_STATUS_NOTIFY:
                    statuses.append(common.decode(common.MSG_STATUS_NOTIFY, msg.data)[0])
        closed_at = loop.time()
        assert sorted(answers) == [m.id for m in sent]  # every query in flight answered ...
        assert all(size > 4 << 20 for size in answers.values())
        assert late.id not in answers  # ... the late one not run
        assert statuses == ["stopping", "standby"]
        # the drain's bound would be 1 s after the close began; a loaded machine's spread kept
        assert closed_at - answered_at < CLOSE_DRAIN_TIMEOUT * 0.8
        await asyncio.wait_for(closing, 3)
    finally:
        await _end(server, sock, closing)


async def _busy(
    request: Callable[[int], Awaitable[object]], outcomes: list[object], warm: asyncio.Event
) -> None:
    """Send request after request until one fails; each outcome noted (the exception's type
    for the last)."""
    i = 0
    while True:
        try:
            outcomes.append(await request(i))
        except Exception as exc:
            outcomes.append(type(exc))
            return
        i += 1
        if i == 10:
            warm.set()


@pytest.mark.parametrize("client_kind", ["ours", "hat"])
async def test_a_busy_client_does_not_stretch_the_close(
    tmp_path: Path, client_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Eight tasks of one client register (with response) and query in a loop while the
    server closes: the close ends once what was in flight is answered, in well under
    ``CLOSE_DRAIN_TIMEOUT`` (before: the whole 1 s, then the requests in flight were cut).
    Each loop ends on the connection's close, never on an error reply; registrations read
    while closing are answered ``failure`` (None), as hat's server answers them when not
    operational."""
    server = await eventer.EventerServer(server_config(tmp_path)).start()
    hat_client: hat_eventer.Client | None = None
    our_client: eventer.Client | None = None
    if client_kind == "hat":
        hat_client = await hat_eventer.connect(net.TcpAddress("127.0.0.1", port_of(server)), "h")
        ended: tuple[type[BaseException], ...] = (ConnectionError,)

        async def request(i: int) -> object:
            assert hat_client is not None
            if i % 2:
                return await hat_client.query(hat.QueryLatestParams([("a", "*")]))
            event = hat.RegisterEvent(("a", str(i % 7)), None, hat.EventPayloadJson(i))
            return await hat_client.register([event], with_response=True)

    else:
        our_client = await eventer.connect(url_of(server), "ours")
        ended = (rpc.ConnectionClosed,)

        async def request(i: int) -> object:
            assert our_client is not None
            if i % 2:
                return await our_client.query(eventer.QueryLatestParams([("a", "*")]))
            return await our_client.register([json_event(("a", str(i % 7)), i)], True)

    outcomes: list[list[object]] = [[] for _ in range(8)]
    warm = [asyncio.Event() for _ in outcomes]
    loops = [asyncio.create_task(_busy(request, o, w)) for o, w in zip(outcomes, warm, strict=True)]
    try:
        async with asyncio.timeout(30):  # 80 requests: over 5 s on a loaded machine
            await asyncio.gather(*(w.wait() for w in warm))
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            took = await _timed_close(server)
        async with asyncio.timeout(3):
            await asyncio.gather(*loops)
        assert took < CLOSE_DRAIN_TIMEOUT * 0.8, took  # before: the whole drain, 1 s
        assert not _cuts(caplog)
        for each in outcomes:
            assert each[-1] in ended, each[-1]  # the close, not an error reply
            assert all(not isinstance(o, type) for o in each[:-1])
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await server.close()
        if hat_client is not None:
            await hat_client.async_close()
        if our_client is not None:
            await our_client.close()


# --- ack-paced clients ------------------------------------------------------------------------


@pytest.mark.parametrize("client_kind", ["ours", "hat"])
async def test_a_client_that_never_acks_holds_the_close_one_bound(
    tmp_path: Path, client_kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``events_ack``, a client whose callback never returns never acks (our client
    acks once the callback returned; hat's reads nothing more meanwhile). STOPPING and
    STANDBY wait behind the notification it holds, so the close gives it
    ``STOP_FLUSH_TIMEOUT``, once: before, the connection's drain then waited as long again
    for that notification's ack (2 s in all) and cut it."""
    server = await eventer.EventerServer(server_config(tmp_path, events_ack=True)).start()
    never = asyncio.Event()
    held = asyncio.Event()

    async def hold(*_: object) -> None:
        held.set()
        await never.wait()

    hat_client: hat_eventer.Client | None = None
    our_client: eventer.Client | None = None
    try:
        if client_kind == "hat":
            hat_client = await hat_eventer.connect(
                net.TcpAddress("127.0.0.1", port_of(server)),
                "slow",
                subscriptions=[("n", "*")],
                events_cb=hold,
            )
        else:
            our_client = await eventer.connect(
                url_of(server), "slow", subscriptions=[("n", "*")], events_cb=hold
            )
        await wait_until(lambda: len(server.clients) == 1)
        await server.register([json_event(("n", "1"))])
        async with asyncio.timeout(3):
            await held.wait()
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            took = await _timed_close(server)
        assert STOP_FLUSH_TIMEOUT * 0.9 <= took < STOP_FLUSH_TIMEOUT * 1.7, took  # before: 2 s
        assert not _cuts(caplog)
    finally:
        never.set()
        await server.close()
        if hat_client is not None:
            await hat_client.async_close()
        if our_client is not None:
            await our_client.close()


async def test_a_client_with_nothing_unacked_is_not_waited_for(tmp_path: Path) -> None:
    """With ``events_ack``, a client that would never ack but has been notified nothing
    (its subscription selects none of the events, STOPPED included) and one that acks
    every notification (STOPPED included) take STOPPING and STANDBY at once: the close
    does not wait. (A guard: this held before too.)"""
    async with running_server(tmp_path, events_ack=True) as server:
        never = asyncio.Event()

        async def hold(*_: object) -> None:
            await never.wait()

        statuses: list[eventer.Status] = []
        seen: list[eventer.EventType] = []
        idle = await eventer.connect(
            url_of(server), "idle", subscriptions=[("nothing",)], events_cb=hold
        )
        acking = await eventer.connect(
            url_of(server),
            "acking",
            subscriptions=[("*",)],
            status_cb=lambda _c, s: statuses.append(s),
            events_cb=lambda _c, events: seen.extend(e.type for e in events),
        )
        try:
            await server.register([json_event(("n", "1"))])
            await wait_until(lambda: ("n", "1") in seen)
            took = await _timed_close(server)
            assert took < STOP_FLUSH_TIMEOUT * 0.8, took  # a wait would take the whole 1 s
            await wait_until(lambda: statuses[-1:] == [eventer.Status.STANDBY])
            S = eventer.Status
            assert statuses == [S.OPERATIONAL, S.STOPPING, S.STANDBY]
            assert seen[-1] == ("event", "1", "engine")  # STOPPED, acked
        finally:
            never.set()
            await idle.close()
            await acking.close()


async def test_a_query_read_before_the_close_but_kept_is_answered(tmp_path: Path) -> None:
    """06294e1: a query read once the server drains its connections is not run (the
    connection closes), those read before are answered. It was decided as the query ran,
    not as it was read: one read before the close and kept in the connection's backlog
    (our output to the client backed up: requests wait then) ran once the client read,
    after the draining began, and went unanswered. Before 06294e1 it ran during the drain
    (the second query, still running, kept the drain going) and was answered."""
    server = await eventer.EventerServer(server_config(tmp_path, system_events=False)).start()
    closing: asyncio.Task[None] | None = None
    await server.register([json_event(("big", str(i)), "x" * (1 << 20)) for i in range(12)])
    sock = await _raw_client(server)
    try:
        sent = [sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False) for _ in range(2)]
        sock.flush()
        peer = server.clients[0].peer
        codec = peer.adapter.codec
        # the first 12-MiB answer waits in our output (the client does not read), the
        # second query waits for it to drain: requests read from now on are kept
        await wait_until(lambda: peer.write_buffer_size > 256 * 1024)
        assert codec.open_conversations == 1  # the second query's
        sent.append(sock.conn.send(common.MSG_QUERY_REQ, _query_bytes(), last=False))
        sock.flush()
        await wait_until(lambda: codec.open_conversations == 2)  # read, and kept
        closing = asyncio.create_task(server.close())
        await wait_until(lambda: server.status is eventer.Status.STANDBY)  # draining now
        answered: list[int] = []
        with pytest.raises(ConnectionError):  # read until the server closes
            while True:
                msg = await sock.receive(timeout=3)
                if msg.type == common.MSG_QUERY_RES:
                    answered.append(msg.first)
        assert answered == [m.id for m in sent]
        await asyncio.wait_for(closing, 3)
    finally:
        await _end(server, sock, closing)

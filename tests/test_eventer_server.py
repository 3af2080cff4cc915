"""Our Eventer client against our Eventer server, over real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import (
    EventId,
    EventPayloadBinary,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
    Timestamp,
)
from tests.certs import Pki
from tests.chatter_socket import ChatterSocket
from tests.peers.eventer_helpers import (
    free_port,
    json_event,
    port_of,
    running_server,
    server_config,
    url_of,
    wait_until,
)
from transports.stream import client_ssl_context
from wire import schemas
from wire.chatter import Dialect


async def raw_peer(server: eventer.EventerServer, registry: rpc.Registry | None = None) -> rpc.Peer:
    """A bare Chatter peer that speaks HatEventer bytes (for protocol-level checks)."""
    return await rpc.connect(
        url_of(server),
        registry=registry or rpc.Registry(),
        sbs_repo=common.peer_repository(),
        reconnect=False,
    )


def init_bytes(name: str = "raw", token: str | None = None, subs=()) -> bytes:
    return common.encode(
        common.MSG_INIT_REQ, common.init_req_to_sbs(name, token, subs, None, False)
    )


async def test_init_register_and_latest(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with await eventer.connect(url_of(server), "test/one") as client:
            assert client.status is Status.OPERATIONAL
            assert client.is_connected
            events = await client.register(
                [
                    json_event(("a", "b"), {"x": 1}),
                    RegisterEvent(("a", "c"), Timestamp(10, 5), EventPayloadBinary("t", b"\0")),
                    RegisterEvent(("a", "d")),
                ],
                with_response=True,
            )
            assert events is not None and len(events) == 3
            assert [e.id.instance for e in events] == [1, 2, 3]
            assert {e.id.server for e in events} == {1}
            assert len({e.id.session for e in events}) == 1
            assert len({e.timestamp for e in events}) == 1
            assert events[1].source_timestamp == Timestamp(10, 5)
            assert events[1].payload == EventPayloadBinary("t", b"\0")
            assert events[0].payload == EventPayloadJson({"x": 1})
            assert await client.register([json_event(("a", "b"), 2)]) is None
            assert await client.register([], with_response=True) == []

            result = await client.query(QueryLatestParams([("a", "b")]))
            assert [e.payload.data for e in result.events] == [2]  # type: ignore[union-attr]
            assert result.more_follows is False

            names = await client.query(QueryLatestParams([("event", "1", "eventer", "*")]))
            assert [(e.type[-1], e.payload.data) for e in names.events] == [  # type: ignore[union-attr]
                ("test/one", "CONNECTED")
            ]


async def test_token_refusal_answers_then_closes(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="secret") as server:
        async with await eventer.connect(url_of(server), "no/token") as client:
            assert client.status is Status.OPERATIONAL
        async with await eventer.connect(url_of(server), "ok", client_token="secret") as client:
            assert client.status is Status.OPERATIONAL
        with pytest.raises(eventer.EventerInitError, match="invalid client token"):
            await eventer.connect(url_of(server), "bad", client_token="wrong")

        # a client that does not close: the server closes after its 0.5 s grace period
        peer = await raw_peer(server)
        started = time.monotonic()
        res = await peer.request(common.MSG_INIT_REQ, init_bytes(token="wrong"), raw=True)
        assert common.decode(common.MSG_INIT_RES, res) == ("error", "invalid client token")
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)
        assert 0.4 <= time.monotonic() - started < 2.0
        assert not server.clients


async def test_notifications_follow_subscriptions_and_server_id(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        received: dict[str, list[list[eventer.Event]]] = {}
        clients = []
        specs = {
            "all": dict(subscriptions=[("*",)]),
            "a-any": dict(subscriptions=[("a", "*")]),
            "a-one": dict(subscriptions=[("a", "?")]),
            "b": dict(subscriptions=[("b",)]),
            "mine": dict(subscriptions=[("a", "*")], server_id=1),
            "other": dict(subscriptions=[("*",)], server_id=2),
            "none": dict(subscriptions=[]),
        }
        for name, kwargs in specs.items():
            received[name] = []
            cb = lambda _c, evs, name=name: received[name].append(evs)  # noqa: E731
            clients.append(await eventer.connect(url_of(server), name, events_cb=cb, **kwargs))
        register_client = clients[-1]
        types = [("a",), ("a", "b"), ("a", "b", "c"), ("b",), ("c",)]
        sent = await register_client.register([RegisterEvent(t) for t in types], with_response=True)
        assert sent is not None
        # a later session that each subscriber above sees: its notification must come next
        marker = [RegisterEvent(("a", "m")), RegisterEvent(("b",))]
        marked = await register_client.register(marker, with_response=True)
        assert marked is not None
        marked_ids = {e.id for e in marked}
        subscribers = ("all", "a-any", "a-one", "b", "mine")
        await wait_until(
            lambda: all(received[n] and received[n][-1][0].id in marked_ids for n in subscribers)
        )

        def got(name: str) -> list[tuple[str, ...]]:
            # one session is never split: exactly one notification per client, then the marker
            assert len(received[name]) == 2, received[name]
            return [e.type for e in received[name][0]]

        assert got("a-any") == [("a",), ("a", "b"), ("a", "b", "c")]
        assert got("mine") == [("a",), ("a", "b"), ("a", "b", "c")]
        assert got("a-one") == [("a", "b")]
        assert got("b") == [("b",)]
        # "all" also saw the CONNECTED events of the clients that came after it
        assert received["all"][-2:] == [sent, marked]
        assert len(received["all"]) == 1 + len(specs) - 1 + 1
        # these see neither session (fanned out with the others' notifications)
        assert received["other"] == [] and received["none"] == []
        for client in clients:
            await client.close()


async def test_own_connect_event_is_not_notified(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        seen: list[list[eventer.Event]] = []
        watcher = await eventer.connect(
            url_of(server),
            "watcher",
            subscriptions=[("event", "*")],
            events_cb=lambda c, e: seen.append(e),
        )
        other = await eventer.connect(url_of(server), "other")
        await other.close()
        await wait_until(lambda: len(seen) == 2)
        assert [(e[0].type[-1], e[0].payload.data) for e in seen] == [  # type: ignore[union-attr]
            ("other", "CONNECTED"),
            ("other", "DISCONNECTED"),
        ]
        await watcher.close()


async def test_every_notification_follows_the_commit(tmp_path: Path) -> None:
    """A persisted client (and any other) is notified only of events already on disk."""
    async with running_server(tmp_path, sync="full") as server:
        db = sqlite3.connect(f"file:{tmp_path / 'events.db'}?mode=ro", uri=True)
        checked: list[bool] = []

        def on_disk(_client, events) -> None:
            for e in events:
                row = db.execute(
                    "SELECT 1 FROM events WHERE server = ? AND session = ? AND instance = ?",
                    tuple(e.id),
                ).fetchone()
                checked.append(row is not None)

        persisted = await eventer.connect(
            url_of(server), "p", subscriptions=[("x", "*")], persisted=True, events_cb=on_disk
        )
        immediate = await eventer.connect(
            url_of(server), "i", subscriptions=[("x", "*")], events_cb=on_disk
        )
        for i in range(20):
            await immediate.register([json_event(("x", str(i)), i)])
        await wait_until(lambda: len(checked) == 40)
        assert all(checked)
        await persisted.close()
        await immediate.close()
        db.close()


async def test_events_with_ack(tmp_path: Path) -> None:
    async with running_server(tmp_path, events_ack=True, ack_timeout=0.5) as server:
        # our client acks automatically, after its callback
        order: list[int] = []

        async def slow(_client, events) -> None:
            await asyncio.sleep(0.02)
            order.extend(e.payload.data for e in events)

        client = await eventer.connect(
            url_of(server), "acker", subscriptions=[("n",)], events_cb=slow
        )
        for i in range(5):
            await client.register([json_event(("n",), i)])
        await wait_until(lambda: len(order) == 5)
        assert order == [0, 1, 2, 3, 4]

        # a bare peer sees last=False notifications and gets the next only after its ack
        gate = asyncio.Event()
        got: list[bytes] = []
        registry = rpc.Registry()

        @registry.handle(common.MSG_EVENTS_NOTIFY)
        async def hold(data: bytes) -> rpc.Reply:
            got.append(data)
            await gate.wait()
            return rpc.Reply(common.MSG_EVENTS_ACK, b"")

        peer = await raw_peer(server, registry)
        await peer.request(common.MSG_INIT_REQ, init_bytes(subs=[("n",)]), raw=True)
        await client.register([json_event(("n",), 5)])
        await client.register([json_event(("n",), 6)])
        await wait_until(lambda: len(got) == 1)
        # the acking client has been notified of both (6 too): the server sent what it could
        await wait_until(lambda: len(order) == 7)
        assert len(got) == 1  # the second waits for the first ack
        gate.set()
        await wait_until(lambda: len(got) == 2)

        # a peer that never acks is dropped after ack_timeout
        never = rpc.Registry()

        @never.handle(common.MSG_EVENTS_NOTIFY)
        async def no_ack(data: bytes) -> None:
            await asyncio.sleep(3600)

        silent = await raw_peer(server, never)
        await silent.request(common.MSG_INIT_REQ, init_bytes(subs=[("n",)]), raw=True)
        await client.register([json_event(("n",), 7)])
        await asyncio.wait_for(asyncio.shield(silent.closed), 3)

        # so is a peer that answers anything but MsgEventsAck
        wrong = rpc.Registry()

        @wrong.handle(common.MSG_EVENTS_NOTIFY)
        def fail(data: bytes) -> None:
            raise ValueError("no")

        failing = await raw_peer(server, wrong)
        await failing.request(common.MSG_INIT_REQ, init_bytes(subs=[("n",)]), raw=True)
        await client.register([json_event(("n",), 8)])
        await asyncio.wait_for(asyncio.shield(failing.closed), 3)
        await peer.close()
        await client.close()


async def test_status_changes(tmp_path: Path) -> None:
    statuses: list[Status] = []
    server = await eventer.EventerServer(server_config(tmp_path)).start()
    try:
        client = await eventer.connect(
            url_of(server), "s", status_cb=lambda _c, s: statuses.append(s)
        )
        await wait_until(lambda: statuses == [Status.OPERATIONAL])
        await server.set_status(Status.STANDBY)
        await wait_until(lambda: client.status is Status.STANDBY)
        assert await client.register([json_event(("x",))], with_response=True) is None
        assert await server.register([json_event(("x",))]) is None
        await server.set_status(Status.STARTING)
        await server.set_status(Status.OPERATIONAL)
        assert await client.register([json_event(("x",))], with_response=True)
    finally:
        await server.close()
    await wait_until(lambda: client.closed.done())
    assert statuses == [
        Status.OPERATIONAL,
        Status.STANDBY,
        Status.STARTING,
        Status.OPERATIONAL,
        Status.STOPPING,
        Status.STANDBY,  # after the flush, before the connection closes (as hat-event)
    ]
    with pytest.raises(rpc.ConnectionClosed):
        await client.register([json_event(("x",))])


async def test_events_iterator_and_in_process_api(tmp_path: Path) -> None:
    async with running_server(tmp_path, database=":memory:") as server:
        async with await eventer.connect(url_of(server), "it", subscriptions=[("q", "*")]) as c:
            stream = c.events()
            local = await server.register([json_event(("q", "1"), "a"), json_event(("q", "2"))])
            assert local is not None
            await c.register([json_event(("q", "3"), "b")])
            first = await asyncio.wait_for(anext(stream), 5)
            second = await asyncio.wait_for(anext(stream), 5)
            assert first == local
            assert [e.type for e in second] == [("q", "3")]
            result = await server.query(QueryTimeseriesParams([("q", "*")], order=Order.ASCENDING))
            assert result.events == [*first, *second]
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), 5)


async def test_protocol_violations_close_the_connection(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        register = common.encode(common.MSG_REGISTER_REQ, [])
        peer = await raw_peer(server)
        peer.notify(common.MSG_REGISTER_REQ, register)  # before init
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        with pytest.raises(rpc.RpcError):
            await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        peer.notify(common.MSG_STATUS_NOTIFY, b"\x80")  # a server's message
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        async with await eventer.connect(url_of(server), "q") as client:
            with pytest.raises(rpc.ConnectionClosed):  # the reference closes too
                await client.query(QueryServerParams(1, last_event_id=EventId(2, 1, 1)))


async def test_bad_registrations_fail_without_side_effects(tmp_path: Path) -> None:
    async with running_server(tmp_path, system_events=False) as server:
        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        bad_json = common.encode(
            common.MSG_REGISTER_REQ,
            [
                {
                    "type": ["x"],
                    "sourceTimestamp": ("none", None),
                    "payload": ("value", ("json", "{x")),
                }
            ],
        )
        for data in (bad_json, b"\x81\x81\x85ab", b"\xff"):
            res = await peer.request(common.MSG_REGISTER_REQ, data, raw=True)
            assert common.decode(common.MSG_REGISTER_RES, res) == ("failure", None)
        good = common.encode(
            common.MSG_REGISTER_REQ,
            [
                {
                    "type": ["x"],
                    "sourceTimestamp": ("none", None),
                    "payload": ("value", ("json", '{"x": [1, 2.5]}')),
                }
            ],
        )
        res = await peer.request(common.MSG_REGISTER_REQ, good, raw=True)
        kind, events = common.decode(common.MSG_REGISTER_RES, res)
        assert kind == "events" and events[0]["id"]["session"] == 1  # no session was used up
        assert (await server.query(QueryServerParams(1))).events[0].payload == EventPayloadJson(
            {"x": [1, 2.5]}
        )
        await peer.close()


# --- queries against a model of the reference's semantics ----------------------------------


def model_timeseries(events: list[eventer.Event], p: QueryTimeseriesParams, cap: int):
    """hat-event's lmdb timeseries query, written out plainly."""
    by_source = p.order_by is OrderBy.SOURCE_TIMESTAMP

    def key(e: eventer.Event) -> Timestamp | None:
        return e.source_timestamp if by_source else e.timestamp

    lo, hi = (p.source_t_from, p.source_t_to) if by_source else (p.t_from, p.t_to)
    candidates = [
        e
        for e in events
        if key(e) is not None and (lo is None or key(e) >= lo) and (hi is None or key(e) <= hi)
    ]
    candidates.sort(key=lambda e: (key(e), e.id), reverse=p.order is Order.DESCENDING)
    limit = cap if p.max_results is None or p.max_results >= cap else max(p.max_results, 0)
    sub = common.Subscription(p.event_types) if p.event_types is not None else None
    sentinel = p.last_event_id
    out = []
    for e in candidates:
        if sentinel is not None:
            if e.id == sentinel:
                sentinel = None
            continue
        src = e.source_timestamp
        if (
            (p.t_from is not None and e.timestamp < p.t_from)
            or (p.t_to is not None and e.timestamp > p.t_to)
            or (p.source_t_from is not None and (src is None or src < p.source_t_from))
            or (p.source_t_to is not None and (src is None or src > p.source_t_to))
            or (sub is not None and not sub.matches(e.type))
        ):
            continue
        out.append(e)
    return out[:limit], len(out) > limit


async def test_queries_match_the_reference_model(tmp_path: Path) -> None:
    async with running_server(tmp_path, system_events=False, max_query_results=7) as server:
        async with await eventer.connect(url_of(server), "q") as client:
            events: list[eventer.Event] = []
            kinds = [("a", "x"), ("a", "y"), ("b", "x"), ("c",)]
            for session in range(12):
                regs = [
                    RegisterEvent(
                        kinds[(session + i) % 4],
                        None if (session + i) % 3 == 0 else Timestamp(1000 - session * 7 + i, i),
                        EventPayloadJson([session, i]),
                    )
                    for i in range(3)
                ]
                if session == 5:  # many types: past MERGE_MAX_TYPES
                    regs += [RegisterEvent(("m", str(i))) for i in range(40)]
                registered = await client.register(regs, with_response=True)
                assert registered is not None
                events += registered
            ts = sorted({e.timestamp for e in events})
            srcs = sorted({e.source_timestamp for e in events if e.source_timestamp})

            type_sets = [
                None,
                [("*",)],
                [("a", "*")],
                [("a", "x")],
                [("?", "x"), ("c",)],
                [("m", "*")],
                [("nope",)],
            ]
            ranges = [
                {},
                {"t_from": ts[3], "t_to": ts[8]},
                {"source_t_from": srcs[2]},
                {"source_t_to": srcs[-3], "t_from": ts[1]},
            ]
            queries = 0
            for types, rng, order, order_by, max_results in itertools.product(
                type_sets, ranges, Order, OrderBy, [None, 3, 0, 100]
            ):
                params = QueryTimeseriesParams(
                    types, order=order, order_by=order_by, max_results=max_results, **rng
                )
                expected = model_timeseries(events, params, cap=7)
                result = await client.query(params)
                assert (result.events, result.more_follows) == expected, params
                queries += 1
                if max_results == 3 and expected[0]:
                    # pagination with last_event_id walks the unlimited order exactly
                    full = model_timeseries(events, params._replace(max_results=None), cap=10**6)
                    pages: list[eventer.Event] = []
                    page = result
                    while True:
                        pages += page.events
                        if not page.more_follows:
                            break
                        page = await client.query(params._replace(last_event_id=page.events[-1].id))
                    assert pages == full[0]
            assert queries == 7 * 4 * 2 * 2 * 4

            # a sentinel outside the ordered range leaves nothing (the reference's rule)
            outside = QueryTimeseriesParams(
                t_from=ts[5], last_event_id=events[0].id, order=Order.ASCENDING
            )
            assert (
                await client.query(outside) == model_timeseries(events, outside, 7) == ([], False)
            )
            unknown = QueryTimeseriesParams(last_event_id=EventId(1, 999, 1))
            assert (await client.query(unknown)).events == []

            # latest: one per type, the latest registered, in first-registered order
            latest = await client.query(QueryLatestParams())
            by_type: dict[tuple[str, ...], eventer.Event] = {}
            for e in events:
                by_type[e.type] = e
            assert latest.events == list(by_type.values())
            wildcard = await client.query(QueryLatestParams([("c",), ("a", "?")]))
            assert wildcard.events == [by_type[("a", "x")], by_type[("a", "y")], by_type[("c",)]]
            assert (await client.query(QueryLatestParams([("b", "x")]))).events == [
                by_type[("b", "x")]
            ]
            assert (await client.query(QueryLatestParams([]))).events == []
            assert (await client.query(QueryLatestParams([("zz",)]))).events == []

            # server: natural order, paginated
            first = await client.query(QueryServerParams(1, max_results=5))
            assert first.events == events[:5] and first.more_follows
            rest = await client.query(
                QueryServerParams(1, persisted=True, last_event_id=first.events[-1].id)
            )
            assert rest.events == events[5:12] and rest.more_follows  # capped at 7
            assert (await client.query(QueryServerParams(2))).events == []


async def test_persistence_across_restart(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with await eventer.connect(url_of(server), "w") as client:
            before = await client.register(
                [json_event(("k", str(i)), i) for i in range(3)], with_response=True
            )
    assert before is not None
    async with running_server(tmp_path) as server:
        async with await eventer.connect(url_of(server), "r") as client:
            latest = await client.query(QueryLatestParams([("k", "*")]))
            assert latest.events == before
            after = await client.register([json_event(("k", "0"), "new")], with_response=True)
            assert after is not None and after[0].id.session > before[0].id.session
            assert after[0].timestamp >= before[0].timestamp
            latest = await client.query(QueryLatestParams([("k", "0")]))
            assert latest.events == after
            engine = await client.query(QueryTimeseriesParams([("event", "1", "engine")]))
            assert [e.payload.data for e in engine.events] == [  # type: ignore[union-attr]
                "STARTED",
                "STOPPED",
                "STARTED",
            ]


async def test_reconnect(tmp_path: Path) -> None:
    port = free_port()
    listen = [f"tcp+sbs://127.0.0.1:{port}"]
    statuses: list[Status] = []
    async with running_server(tmp_path, listen=listen) as server:
        client = await eventer.connect(
            url_of(server),
            "r",
            subscriptions=[("z",)],
            reconnect=True,
            reconnect_delay=0.05,
            status_cb=lambda _c, s: statuses.append(s),
        )
        stream = client.events()
        await client.register([json_event(("z",), 1)])
        assert [e.payload.data for e in await asyncio.wait_for(anext(stream), 5)] == [1]
    await wait_until(lambda: not client.is_connected)
    async with running_server(tmp_path, listen=listen):
        await client.wait_connected(5)
        await client.register([json_event(("z",), 2)])
        assert [e.payload.data for e in await asyncio.wait_for(anext(stream), 5)] == [2]
        assert statuses[-1] is Status.OPERATIONAL and Status.STOPPING in statuses
        await client.close()
    assert client.closed.done()


async def test_tls(tmp_path: Path, pki: Pki) -> None:
    tls = eventer.TlsConfig(str(pki.server_cert), str(pki.server_key))
    async with running_server(tmp_path, listen=["ssl+sbs://127.0.0.1:0"], tls=tls) as server:
        ctx = client_ssl_context(cafile=pki.ca)
        async with await eventer.connect(url_of(server), "tls", ssl=ctx) as client:
            assert await client.register([json_event(("t",))], with_response=True)


async def test_a_client_that_stops_reading_is_closed_not_buffered(tmp_path: Path) -> None:
    repo = schemas.repository()
    backlog = 2 * 1024 * 1024
    async with running_server(tmp_path, max_client_backlog=backlog) as server:
        slow = await ChatterSocket.connect("127.0.0.1", port_of(server), Dialect.CURRENT)
        init = {
            "clientName": "slow",
            "clientToken": ("none", None),
            "subscriptions": [["*"]],
            "serverId": ("none", None),
            "persisted": False,
        }
        slow.conn.send(
            "HatEventer.MsgInitReq", repo.encode("HatEventer.MsgInitReq", init), last=False
        )
        slow.flush()
        reply = await slow.receive()
        assert reply.type == "HatEventer.MsgInitRes"
        await wait_until(lambda: any(c.name == "slow" for c in server.clients))
        # from now on the slow client reads nothing; another client registers 64 KiB events
        async with await eventer.connect(url_of(server), "writer") as writer:
            big = "x" * 65536
            for i in range(200):  # ~13 MiB of notifications for the slow client
                await writer.register([json_event(("big", str(i)), big)], with_response=True)
                if not any(c.name == "slow" for c in server.clients):
                    break
            await wait_until(lambda: all(c.name != "slow" for c in server.clients))
            # the server and its other clients are fine
            result = await writer.query(eventer.QueryLatestParams([("big", "0")]))
            assert len(result.events) == 1
        await slow.close()


async def test_queries_past_max_concurrent_wait_instead_of_a_retry(tmp_path: Path) -> None:
    """Hat clients cannot decode PeerwireRpc.Retry: past 1,024 requests in progress on a
    connection the server stops reading from it instead of answering with one."""
    async with running_server(tmp_path) as server:
        peer = await rpc.connect(
            url_of(server),
            registry=rpc.Registry(),
            sbs_repo=common.peer_repository(),
            reconnect=False,
            options=rpc.Options(retries=0),  # a retry result would raise RetryLater
        )
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        [server_peer] = [p for s in server.servers for p in s.peers]
        assert not server_peer.adapter.retry_results
        query = common.encode(
            common.MSG_QUERY_REQ, common.query_params_to_sbs(QueryLatestParams([("a", "*")]))
        )
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, server_peer.handlers_running)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        try:
            calls = (peer.request(common.MSG_QUERY_REQ, query, raw=True) for _ in range(1300))
            replies = await asyncio.gather(*calls)
        finally:
            watcher.cancel()
        assert len(replies) == 1300
        assert 0 < most <= 1024
        await peer.close()

"""Eventer interoperability with PyPI hat-event 0.9.44, both directions, on loopback:
hat's client against our server; our client against hat's bare ``eventer.listen`` and
against its full server (MainRunner, lmdb backend)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event import eventer as hat_eventer
from hat.event.server.main_runner import MainRunner

import rpc
from rpc import eventer
from rpc.eventer import common
from tests.peers.eventer_hat_server import hat_full_server, hat_server_conf, wait_operational
from tests.peers.eventer_helpers import free_port, port_of, running_server, url_of, wait_until

pytestmark = pytest.mark.interop


def addr(port: int) -> net.TcpAddress:
    return net.TcpAddress("127.0.0.1", port)


def as_ours(event: hat.Event) -> eventer.Event:
    """hat's Event -> ours, through the wire format (the bytes must mean the same)."""
    data = hat.sbs_repo.encode("HatEventer.Event", hat.event_to_sbs(event))
    return common.event_from_sbs(common.decode("HatEventer.Event", data))


# --- hat's client, our server ------------------------------------------------------------


async def test_hat_client_against_our_server(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="secret") as server:
        port = port_of(server)
        notified: asyncio.Queue[list[hat.Event]] = asyncio.Queue()
        client = await hat_eventer.connect(
            addr(port),
            "hat/client",
            client_token="secret",
            subscriptions=[("a", "*")],
            events_cb=lambda _c, events: notified.put_nowait(list(events)),
        )
        assert client.status == hat.Status.OPERATIONAL
        source = hat.Timestamp(100, 7)
        registered = await client.register(
            [
                hat.RegisterEvent(("a", "b"), source, hat.EventPayloadJson({"x": [1, "y"]})),
                hat.RegisterEvent(("a", "c"), None, hat.EventPayloadBinary("bin", b"\x00\xff")),
                hat.RegisterEvent(("z",), None, None),
            ],
            with_response=True,
        )
        assert registered is not None and [e.type for e in registered] == [
            ("a", "b"),
            ("a", "c"),
            ("z",),
        ]
        assert registered[0].payload == hat.EventPayloadJson({"x": [1, "y"]})
        assert registered[0].source_timestamp == source
        assert registered[0].id.session == registered[2].id.session
        assert await asyncio.wait_for(notified.get(), 5) == registered[:2]

        await client.register([hat.RegisterEvent(("a", "d"), None, None)])  # no response
        (fire_and_forget,) = await asyncio.wait_for(notified.get(), 5)
        assert fire_and_forget.type == ("a", "d")

        latest = await client.query(hat.QueryLatestParams([("a", "?")]))
        assert list(latest.events) == [*registered[:2], fire_and_forget]
        series = await client.query(
            hat.QueryTimeseriesParams(
                [("a", "*"), ("z",)], order=hat.Order.ASCENDING, max_results=2
            )
        )
        assert list(series.events) == registered[:2] and series.more_follows
        page = await client.query(
            hat.QueryTimeseriesParams(
                [("a", "*"), ("z",)],
                order=hat.Order.ASCENDING,
                max_results=2,
                last_event_id=series.events[-1].id,
            )
        )
        assert list(page.events) == [registered[2], fire_and_forget] and not page.more_follows
        by_source = await client.query(
            hat.QueryTimeseriesParams(order_by=hat.OrderBy.SOURCE_TIMESTAMP)
        )
        assert list(by_source.events) == [registered[0]]
        own = await client.query(hat.QueryServerParams(1, persisted=True))
        assert list(own.events)[-4:] == [*registered, fire_and_forget]
        assert [e.type[-1] for e in own.events[:2]] == ["engine", "hat/client"]
        await client.async_close()

        with pytest.raises(hat_eventer.EventerInitError, match="invalid client token"):
            await hat_eventer.connect(addr(port), "hat/bad", client_token="wrong")


async def test_hat_client_acks_our_notifications(tmp_path: Path) -> None:
    async with running_server(tmp_path, events_ack=True, ack_timeout=2) as server:
        seen: list[tuple[str, ...]] = []
        client = await hat_eventer.connect(
            addr(port_of(server)),
            "hat/acker",
            subscriptions=[("n", "*")],
            persisted=True,
            events_cb=lambda _c, events: seen.extend(e.type for e in events),
        )
        for i in range(5):
            await client.register([hat.RegisterEvent(("n", str(i)), None, None)])
        await wait_until(lambda: len(seen) == 5)
        assert seen == [("n", str(i)) for i in range(5)]
        assert client.is_open  # every ack arrived in time
        await server.set_status(eventer.Status.STANDBY)
        await wait_until(lambda: client.status == hat.Status.STANDBY)
        assert await client.register([hat.RegisterEvent(("n",), None, None)], True) is None
        await client.async_close()


# --- our client, hat's bare eventer server -------------------------------------------------


async def test_our_client_against_hat_listen() -> None:
    registered: list[list[hat.RegisterEvent]] = []
    queried: list[hat.QueryParams] = []
    infos: list[hat_eventer.ConnectionInfo] = []

    async def on_connected(info: hat_eventer.ConnectionInfo) -> None:
        if info.client_token == "refuse":
            raise Exception("go away")
        infos.append(info)

    async def on_register(_info, events):
        registered.append(list(events))
        if events[0].type == ("fail",):
            return None
        now = hat.now()
        return [
            hat.Event(
                hat.EventId(9, len(registered), i), e.type, now, e.source_timestamp, e.payload
            )
            for i, e in enumerate(events, 1)
        ]

    async def on_query(_info, params):
        # not the probe that confirms a registration without response when no request of
        # ours follows it within a second (a latest query for no types, empty answer)
        if params != hat.QueryLatestParams([]):
            queried.append(params)
        event = hat.Event(hat.EventId(9, 1, 1), ("q",), hat.now(), None, None)
        return hat.QueryResult([event], more_follows=True)

    port = free_port()
    server = await hat_eventer.listen(
        addr(port),
        status=hat.Status.OPERATIONAL,
        connected_cb=on_connected,
        register_cb=on_register,
        query_cb=on_query,
    )
    url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
    try:
        statuses: list[eventer.Status] = []
        received: list[list[eventer.Event]] = []
        client = await eventer.connect(
            url,
            "pw/client",
            client_token="tok",
            subscriptions=[("a", "*")],
            server_id=9,
            persisted=True,
            status_cb=lambda _c, s: statuses.append(s),
            events_cb=lambda _c, e: received.append(e),
        )
        await wait_until(lambda: len(infos) == 1)
        info = infos[0]
        assert (info.client_name, info.client_token, info.server_id, info.persisted) == (
            "pw/client",
            "tok",
            9,
            True,
        )
        assert info.subscription.matches(("a", "x")) and not info.subscription.matches(("b",))

        ours = [
            eventer.RegisterEvent(
                ("a",), eventer.Timestamp(1, 2), eventer.EventPayloadJson({"k": 1})
            ),
            eventer.RegisterEvent(("b",), None, eventer.EventPayloadBinary("t", b"\x01")),
        ]
        events = await client.register(ours, with_response=True)
        assert events is not None and [e.id for e in events] == [
            eventer.EventId(9, 1, 1),
            eventer.EventId(9, 1, 2),
        ]
        assert registered[0] == [
            hat.RegisterEvent(("a",), hat.Timestamp(1, 2), hat.EventPayloadJson({"k": 1})),
            hat.RegisterEvent(("b",), None, hat.EventPayloadBinary("t", b"\x01")),
        ]
        assert [e.payload for e in events] == [r.payload for r in ours]
        assert await client.register([eventer.RegisterEvent(("fail",))], with_response=True) is None
        await client.register([eventer.RegisterEvent(("nr",))])
        await wait_until(lambda: len(registered) == 3)

        params = eventer.QueryTimeseriesParams(
            [("a", "*")],
            t_from=eventer.Timestamp(5, 0),
            source_t_to=eventer.Timestamp(9, 9),
            order=eventer.Order.ASCENDING,
            order_by=eventer.OrderBy.SOURCE_TIMESTAMP,
            max_results=3,
            last_event_id=eventer.EventId(9, 1, 1),
        )
        result = await client.query(params)
        assert [e.type for e in result.events] == [("q",)] and result.more_follows
        assert queried[0] == hat.QueryTimeseriesParams(
            [("a", "*")],
            t_from=hat.Timestamp(5, 0),
            source_t_to=hat.Timestamp(9, 9),
            order=hat.Order.ASCENDING,
            order_by=hat.OrderBy.SOURCE_TIMESTAMP,
            max_results=3,
            last_event_id=hat.EventId(9, 1, 1),
        )
        await client.query(eventer.QueryServerParams(9, persisted=True, max_results=1))
        await client.query(eventer.QueryLatestParams())
        assert queried[1:] == [
            hat.QueryServerParams(9, persisted=True, max_results=1),
            hat.QueryLatestParams(None),
        ]

        pushed = [hat.Event(hat.EventId(9, 5, 1), ("a", "n"), hat.now(), None, None)]
        await server.notify_events(pushed, persisted=True)  # last = True
        await server.notify_events(pushed, persisted=True, with_ack=True)  # waits for the ack
        await server.notify_events(pushed, persisted=False)  # not for a persisted client
        await wait_until(lambda: len(received) == 2)
        assert received == [[as_ours(pushed[0])]] * 2

        await server.set_status(hat.Status.STOPPING)
        await wait_until(lambda: statuses == [eventer.Status.OPERATIONAL, eventer.Status.STOPPING])
        # the status change came after the non-persisted notify on the same connection: had
        # that one been delivered, it would be here by now
        assert received == [[as_ours(pushed[0])]] * 2
        await client.close()

        with pytest.raises(eventer.EventerInitError, match="go away"):
            await eventer.connect(url, "pw/refused", client_token="refuse")
    finally:
        await server.async_close()


# --- our client, hat's full server ---------------------------------------------------------


def project(events: list[eventer.Event]) -> list[tuple]:
    """What two servers must agree on (ids and timestamps are their own)."""
    return [(e.type, e.source_timestamp, e.payload) for e in events]


async def test_our_client_against_hat_full_server(tmp_path: Path) -> None:
    async with hat_full_server(tmp_path / "hat.lmdb") as url:
        seen: list[list[eventer.Event]] = []
        listener = await eventer.connect(
            url, "pw/listener", subscriptions=[("d", "*")], events_cb=lambda _c, e: seen.append(e)
        )
        client = await eventer.connect(url, "pw/writer", reconnect=False)
        assert client.status is eventer.Status.OPERATIONAL
        events = await client.register(
            [eventer.RegisterEvent(("d", "1"), None, eventer.EventPayloadJson("v"))],
            with_response=True,
        )
        assert events is not None and events[0].id.server == 1
        await wait_until(lambda: seen == [events])
        latest = await client.query(eventer.QueryLatestParams([("d", "?")]))
        assert latest.events == events
        server = await client.query(eventer.QueryServerParams(1))
        assert events[0] in server.events
        await listener.close()
        await client.close()


async def test_query_semantics_agree_with_hat_full_server(tmp_path: Path) -> None:
    """The same registrations on both servers; every query must select the same events."""
    batches = [
        [
            eventer.RegisterEvent(
                ("d", ["x", "y", "z"][(s + i) % 3], str(i % 2)),
                None if (s * 3 + i) % 4 == 0 else eventer.Timestamp(500 - 3 * s + i, 0),
                eventer.EventPayloadJson([s, i]),
            )
            for i in range(3)
        ]
        for s in range(8)
    ]
    results: dict[str, list] = {}
    async with (
        hat_full_server(tmp_path / "hat.lmdb") as hat_url,
        running_server(tmp_path) as ours,
    ):
        for name, url in (("hat", hat_url), ("ours", url_of(ours))):
            client = await eventer.connect(url, "pw/diff", timeout=20)
            for batch in batches:
                assert await client.register(batch, with_response=True)
            answers = []
            for types, order, order_by, max_results in itertools.product(
                [[("d", "*")], [("d", "x", "?")], [("d", "?", "1"), ("d", "y", "*")]],
                eventer.Order,
                eventer.OrderBy,
                [None, 4],
            ):
                params = eventer.QueryTimeseriesParams(
                    types, order=order, order_by=order_by, max_results=max_results
                )
                result = await client.query(params)
                answers.append((project(result.events), result.more_follows))
                if result.events and max_results:
                    page = await client.query(params._replace(last_event_id=result.events[-1].id))
                    answers.append((project(page.events), page.more_follows))
            latest = await client.query(eventer.QueryLatestParams([("d", "*")]))
            answers.append(sorted(project(latest.events), key=repr))
            await client.close()
            results[name] = answers
    pages = [a for a in results["ours"] if isinstance(a, tuple)]
    assert sum(len(events) for events, _ in pages) > 200 and any(more for _, more in pages)
    assert results["ours"] == results["hat"]


async def test_our_client_reconnects_to_hat_full_server(tmp_path: Path) -> None:
    port = free_port()
    url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
    conf = hat_server_conf(port, str(tmp_path / "hat.lmdb"))
    runner = MainRunner(conf)
    await wait_operational(port)
    client = await eventer.connect(url, "pw/r", reconnect=True, reconnect_delay=0.05)
    await runner.async_close()
    await wait_until(lambda: not client.is_connected)
    runner = MainRunner(conf)
    try:
        await client.wait_connected(10)
        await wait_until(lambda: client.status is eventer.Status.OPERATIONAL, 10)
        assert await client.register([eventer.RegisterEvent(("r",))], with_response=True)
    finally:
        await client.close()
        await runner.async_close()
    with pytest.raises(rpc.ConnectionClosed):
        await client.register([eventer.RegisterEvent(("r",))])

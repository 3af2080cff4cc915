"""Our Eventer client against our Eventer server, over real sockets on 127.0.0.1: connecting
and registering, status changes, persistence across a restart, reconnecting and TLS.

The server's notifications, its queries and its answers to misbehaving clients are in
test_eventer_server_notifications.py, test_eventer_server_queries.py and
test_eventer_server_hostile.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer.common import (
    EventPayloadBinary,
    EventPayloadJson,
    QueryLatestParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
    Timestamp,
)
from tests.certs import Pki
from tests.peers.eventer_helpers import (
    free_port,
    json_event,
    running_server,
    server_config,
    url_of,
    wait_until,
)
from transports.stream import client_ssl_context


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
        assert [e.payload.data for e in await asyncio.wait_for(anext(stream), 5)] == [1]  # type: ignore[union-attr]
    await wait_until(lambda: not client.is_connected)
    async with running_server(tmp_path, listen=listen):
        await client.wait_connected(5)
        await client.register([json_event(("z",), 2)])
        assert [e.payload.data for e in await asyncio.wait_for(anext(stream), 5)] == [2]  # type: ignore[union-attr]
        assert statuses[-1] is Status.OPERATIONAL and Status.STOPPING in statuses
        await client.close()
    assert client.closed.done()


async def test_tls(tmp_path: Path, pki: Pki) -> None:
    tls = eventer.TlsConfig(str(pki.server_cert), str(pki.server_key))
    async with running_server(tmp_path, listen=["ssl+sbs://127.0.0.1:0"], tls=tls) as server:
        ctx = client_ssl_context(cafile=pki.ca)
        async with await eventer.connect(url_of(server), "tls", ssl=ctx) as client:
            assert await client.register([json_event(("t",))], with_response=True)

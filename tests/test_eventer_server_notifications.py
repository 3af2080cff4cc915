"""Our Eventer server's notifications, to our client and to bare peers, over real sockets on
127.0.0.1: who is notified of what (subscriptions, server id, one's own CONNECTED event),
only after the commit, one at a time with acks (and the peers that never ack), and the
client's events() iterator next to the server's in-process API."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import rpc
from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import Order, QueryTimeseriesParams, RegisterEvent
from tests.peers.eventer_helpers import (
    init_bytes,
    json_event,
    raw_peer,
    running_server,
    url_of,
    wait_until,
)


async def test_notifications_follow_subscriptions_and_server_id(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        received: dict[str, list[list[eventer.Event]]] = {}
        clients = []
        specs: dict[str, dict[str, Any]] = {
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

        def on_disk(_client: eventer.Client, events: list[eventer.Event]) -> None:
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

        async def slow(_client: eventer.Client, events: list[eventer.Event]) -> None:
            await asyncio.sleep(0.02)  # the callback's work, before its ack (not a wait)
            order.extend(e.payload.data for e in events)  # type: ignore[union-attr,misc]

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
            await asyncio.sleep(3600)  # never returns, so never acks (not a wait)

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

"""Differential test: one scripted scenario (subscriptions, registrations, every query
kind with pagination, a restart on the same storage, more registrations) run against our
server and hat-event 0.9.44's full server (lmdb backend); the results must agree field by
field. Ids and timestamps are each server's own, so they are compared through what they
identify: every event is named by its registration (batch, position), every timestamp by
its batch, and both servers must give each batch one session, instances 1..n and one
timestamp, increasing across batches and across the restart."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from rpc import eventer
from rpc.eventer.common import Subscription
from tests.peers.eventer_hat_server import hat_full_server
from tests.peers.eventer_helpers import running_server, url_of, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

E = eventer
TYPES = [("a", "x"), ("a", "y", "z"), ("b",), ("c", "x"), ("a",)]
SUBSCRIPTIONS = {"listener/a": [("a", "*")], "listener/b": [("?", "x"), ("b",)]}


def batch(k: int, size: int) -> list[E.RegisterEvent]:
    events = []
    for i in range(size):
        n = k * 7 + i
        source = None if n % 3 == 0 else E.Timestamp(1000 - 10 * k + i, n % 5)
        payload = [
            E.EventPayloadJson({"k": k, "i": i}),
            E.EventPayloadBinary("bin", bytes([k, i])),
            None,
        ][n % 3]
        events.append(E.RegisterEvent(TYPES[n % len(TYPES)], source, payload))
    return events


BEFORE = [batch(k, 1 + k % 5) for k in range(6)]
AFTER = [batch(k, 1 + k % 4) for k in range(6, 9)]


class Names:
    """Each server's ids and timestamps -> names shared by both runs."""

    def __init__(self) -> None:
        self.ids: dict[E.EventId, str] = {}
        self.stamps: dict[E.Timestamp, int] = {}
        self.last: tuple[int, E.Timestamp] = (0, E.Timestamp(0, 0))

    def learn(self, k: int, events: list[E.Event]) -> None:
        sessions = {e.id.session for e in events}
        stamps = {e.timestamp for e in events}
        assert len(sessions) == 1 and len(stamps) == 1, "one session, one timestamp per batch"
        assert [e.id.instance for e in events] == list(range(1, len(events) + 1))
        session, stamp = sessions.pop(), stamps.pop()
        assert (session, stamp) > self.last, "sessions and timestamps grow"
        self.last = (session, stamp)
        self.stamps[stamp] = k
        for e in events:
            self.ids[e.id] = f"B{k}.{e.id.instance}"

    def event(self, e: E.Event) -> tuple:
        return (self.ids[e.id], e.type, self.stamps[e.timestamp], e.source_timestamp, e.payload)

    def events(self, events: list[E.Event]) -> list[tuple]:
        return [self.event(e) for e in events if e.type[0] != "event"]  # not system events


async def paginate(client: E.Client, params: Any) -> list[E.QueryResult]:
    results = []
    while True:
        result = await client.query(params)
        results.append(result)
        if not result.more_follows:
            return results
        params = params._replace(last_event_id=result.events[-1].id)


async def queries(client: E.Client, names: Names) -> list[Any]:
    """Every query kind; timeseries pages compared page by page."""
    out: list[Any] = []
    for types in (None, [("a", "*")], [("?", "x")], [("b",), ("a",)], [("nope",)]):
        latest = await client.query(E.QueryLatestParams(types))
        assert not latest.more_follows
        out.append(("latest", types, sorted(names.events(latest.events), key=repr)))
    stamp = {k: t for t, k in names.stamps.items()}
    bounds = [
        {},
        {"t_from": stamp[2], "t_to": stamp[4]},
        {"source_t_from": E.Timestamp(975, 0), "source_t_to": E.Timestamp(995, 3)},
    ]
    for types, order, order_by, max_results, (b, bound) in itertools.product(
        [[("a", "*")], [("?", "x"), ("b",)], [(t[0], "*") for t in TYPES]],
        E.Order,
        E.OrderBy,
        [None, 3],
        enumerate(bounds),
    ):
        params = E.QueryTimeseriesParams(
            types, order=order, order_by=order_by, max_results=max_results, **bound
        )
        pages = await paginate(client, params)
        key = (types, order, order_by, max_results, b)
        out.append(("timeseries", key, [(names.events(p.events), p.more_follows) for p in pages]))
    pages = await paginate(client, E.QueryServerParams(1, max_results=4))
    assert len(pages) > 3
    out.append(("server", [names.event(e) for p in pages for e in p.events if e.id in names.ids]))
    return out


async def scenario(open_server: Callable[[], Any]) -> list[Any]:
    names = Names()
    record: list[Any] = []
    async with open_server() as url:
        notified: dict[str, list[E.Event]] = {name: [] for name in SUBSCRIPTIONS}
        listeners = [
            await E.connect(
                url,
                name,
                subscriptions=subs,
                events_cb=lambda _c, evs, seen=notified[name]: seen.extend(evs),
            )
            for name, subs in SUBSCRIPTIONS.items()
        ]
        writer = await E.connect(url, "writer", timeout=20)
        for k, events in enumerate(BEFORE):
            registered = await writer.register(events, with_response=True)
            assert registered is not None
            names.learn(k, registered)
        for name, subs in SUBSCRIPTIONS.items():
            sub = Subscription(subs)
            expected = sum(sub.matches(e.type) for b in BEFORE for e in b)
            await wait_until(lambda n=name, x=expected: len(names.events(notified[n])) == x)
            record.append(("notified", name, names.events(notified[name])))
        record += await queries(writer, names)
        for client in (*listeners, writer):
            await client.close()
    async with open_server() as url:  # restart on the same storage
        writer = await E.connect(url, "writer", timeout=20)
        record += await queries(writer, names)
        for k, events in enumerate(AFTER, len(BEFORE)):
            registered = await writer.register(events, with_response=True)
            assert registered is not None
            names.learn(k, registered)
        record += await queries(writer, names)
        await writer.close()
    return record


async def test_scenario_agrees_with_hat_event_field_by_field(tmp_path: Path) -> None:
    @contextlib.asynccontextmanager
    async def ours() -> AsyncIterator[str]:
        async with running_server(tmp_path / "ours") as server:
            yield url_of(server)

    (tmp_path / "ours").mkdir()
    mine = await scenario(ours)
    theirs = await scenario(lambda: hat_full_server(tmp_path / "hat.lmdb"))
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert a == b
    paged = [r for r in mine if r[0] == "timeseries" and len(r[2]) > 1]
    assert (
        paged and sum(len(events) for r in mine if r[0] == "timeseries" for events, _ in r[2]) > 300
    )

"""Our Eventer server's queries (timeseries, latest, server) against a plain model of the
reference's semantics: filters, orders, limits and pagination with last_event_id."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import (
    EventId,
    EventPayloadJson,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryServerParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Timestamp,
)
from tests.peers.eventer_helpers import running_server, url_of


def model_timeseries(
    events: list[eventer.Event], p: QueryTimeseriesParams, cap: int
) -> tuple[list[eventer.Event], bool]:
    """hat-event's lmdb timeseries query, written out plainly."""
    by_source = p.order_by is OrderBy.SOURCE_TIMESTAMP

    def key(e: eventer.Event) -> Timestamp | None:
        return e.source_timestamp if by_source else e.timestamp

    lo, hi = (p.source_t_from, p.source_t_to) if by_source else (p.t_from, p.t_to)
    candidates = [
        e
        for e in events
        if key(e) is not None and (lo is None or key(e) >= lo) and (hi is None or key(e) <= hi)  # type: ignore[operator]
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
            ranges: list[dict[str, Any]] = [
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

"""Our Eventer server's bounds on what clients send: event types and subscriptions past
``MAX_TYPE_SEGMENTS`` segments are refused and stop nothing else, the wildcard pattern
cache holds at most ``PATTERN_CACHE_IDS`` type ids, and a message type the Eventer does
not know closes the connection (as the reference does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import (
    MAX_TYPE_SEGMENTS,
    QueryLatestParams,
    QueryTimeseriesParams,
    RegisterEvent,
    Status,
)
from rpc.eventer.queries import PATTERN_CACHE_IDS
from tests.peers.eventer_helpers import (
    init_bytes,
    json_event,
    raw_peer,
    running_server,
    url_of,
    wait_until,
)


async def test_a_deep_subscription_or_type_is_refused_and_stops_nothing(tmp_path: Path) -> None:
    """A 1,200-segment subscription used to be accepted, and the match of a 1,200-segment
    type against it raised RecursionError in the writer after the commit: the writer
    stopped, that registrant was never answered and every later registration failed."""
    deep = ("a",) * 1200
    async with running_server(tmp_path) as server:
        with pytest.raises(eventer.EventerInitError, match="segments"):
            await eventer.connect(url_of(server), "deep", subscriptions=[deep])
        async with await eventer.connect(url_of(server), "b", subscriptions=[("x", "*")]) as b:
            refused = b.register([json_event(deep, 1)], with_response=True)
            assert await asyncio.wait_for(refused, 5) is None
            normal = b.register([json_event(("x", "1"), 2)], with_response=True)
            events = await asyncio.wait_for(normal, 5)
            assert events is not None and [e.type for e in events] == [("x", "1")]
        assert server.status is Status.OPERATIONAL


async def test_types_at_the_segment_limit_work_and_past_it_are_refused(tmp_path: Path) -> None:
    longest = tuple(f"s{i}" for i in range(MAX_TYPE_SEGMENTS))
    pattern = (*longest[:-2], "?", "*")
    async with running_server(tmp_path) as server:
        async with await eventer.connect(url_of(server), "sub", subscriptions=[pattern]) as sub:
            notified = sub.events()
            registered = await sub.register([json_event(longest, 1)], with_response=True)
            assert registered is not None
            assert [e.type for e in await asyncio.wait_for(anext(notified), 5)] == [longest]
            result = await sub.query(QueryLatestParams([pattern]))
            assert [e.type for e in result.events] == [longest]
            assert await sub.register([json_event((*longest, "x"))], with_response=True) is None
        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        too_deep = common.encode(
            common.MSG_QUERY_REQ,
            common.query_params_to_sbs(QueryLatestParams([(*longest, "*")])),
        )
        with pytest.raises(rpc.RpcError):  # a query that is not one closes, as before
            await peer.request(common.MSG_QUERY_REQ, too_deep, raw=True)
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)


async def test_the_pattern_cache_holds_a_bounded_number_of_type_ids(tmp_path: Path) -> None:
    """Each distinct wildcard query used to keep its matching type ids, up to 1,024
    patterns whatever their size (with 100,000 types, about 780 MiB)."""
    types = 20_000
    patterns = PATTERN_CACHE_IDS // types + 10  # together they match more than the budget
    async with running_server(tmp_path, system_events=False) as server:
        async with await eventer.connect(url_of(server), "c") as client:
            for start in range(0, types, 5000):
                batch = [RegisterEvent(("t", str(i))) for i in range(start, start + 5000)]
                assert await client.register(batch, with_response=True) is not None
            for p in range(patterns):
                query = QueryTimeseriesParams([("t", "*"), ("pad", str(p))], max_results=1)
                assert len((await client.query(query)).events) == 1
        queries = server._started().queries
        assert types <= queries.cached_ids <= PATTERN_CACHE_IDS


@pytest.mark.parametrize("initialised", [False, True])
@pytest.mark.parametrize("as_request", [True, False])
async def test_a_message_type_the_eventer_does_not_know_closes_the_connection(
    tmp_path: Path, initialised: bool, as_request: bool
) -> None:
    """It used to be answered with an error (a request) or dropped (a notification), the
    connection left open."""
    async with running_server(tmp_path) as server:
        peer = await raw_peer(server)
        if initialised:
            await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
            assert len(server.clients) == 1
        if as_request:
            with pytest.raises(rpc.ConnectionClosed):
                await peer.request("Foo.Bar", b"x", raw=True)
        else:
            peer.notify("Foo.Bar", b"x")
        await asyncio.wait_for(asyncio.shield(peer.closed), 1)
        await wait_until(lambda: not server.clients)

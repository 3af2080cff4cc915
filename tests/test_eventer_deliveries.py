"""Our Eventer client's deliveries (callbacks and iterators) against our Eventer server,
over real sockets on 127.0.0.1: bounded when the application is slow, answered when a
callback asks the server something, ended when the client closes."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from rpc import eventer
from rpc.eventer.common import QueryLatestParams, RegisterEvent
from tests.peers.eventer_helpers import json_event, running_server, url_of, wait_until


async def flooded_reader(
    server: eventer.EventerServer, events_cb: Any, count: int
) -> tuple[eventer.Client, eventer.Client]:
    """A client subscribed to ``("n", "*")`` with ``events_queue_size=8`` whose
    ``events_cb`` does not return yet, and another that registered ``count`` sessions for
    it, one notification each: past 8 + 1,024 (``max_concurrent``) the reader stops
    reading. Returns both once it has (the writer to be closed by the caller)."""
    reader = await eventer.connect(
        url_of(server), "reader", subscriptions=[("n", "*")], events_cb=events_cb,
        events_queue_size=8,
    )  # fmt: skip
    writer = await eventer.connect(url_of(server), "writer")
    for i in range(count):
        await writer.register([RegisterEvent(("n", str(i)))])
    connection = reader.connection.connection if reader.connection else None
    assert connection is not None
    await wait_until(lambda: not connection.transport.is_reading())
    return reader, writer


async def test_a_slow_events_callback_slows_the_server_not_memory(tmp_path: Path) -> None:
    """Past ``events_queue_size`` undelivered notifications the client stops reading once
    ``max_concurrent`` (1,024) more wait; delivery stays in order and complete."""
    async with running_server(tmp_path) as server:
        release = asyncio.Event()
        delivered: list[eventer.Event] = []

        async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
            await release.wait()
            delivered.extend(events)

        reader, writer = await flooded_reader(server, slow_cb, 1500)
        async with writer:
            last = await writer.register([RegisterEvent(("n", "last"))], with_response=True)
            assert last is not None
            assert reader._deliveries.qsize() <= 8 + 1024 + 1
            release.set()
            await wait_until(lambda: delivered and delivered[-1].id == last[0].id, timeout=20)
        assert [e.type[1] for e in delivered] == [*map(str, range(1500)), "last"]
        await reader.close()


async def test_iterators_end_when_the_client_closes(tmp_path: Path) -> None:
    """One waiting for events ends at the close; a full one gives what it holds, then ends."""
    async with running_server(tmp_path, database=":memory:") as server:
        c = await eventer.connect(
            url_of(server), "it", subscriptions=[("q", "*")], events_queue_size=2
        )
        idle, full = c.events(), c.events()
        waiting = asyncio.ensure_future(anext(idle))
        for i in range(2):
            await c.register([json_event(("q", str(i)))], with_response=True)
        first = await asyncio.wait_for(waiting, 5)
        assert [e.type for e in first] == [("q", "0")]
        await wait_until(lambda: c._deliveries.empty())  # ("q", "1") in both iterators
        waiting = asyncio.ensure_future(anext(idle))
        await asyncio.sleep(0)  # the iterator takes ("q", "1") without waiting
        assert [e.type for e in waiting.result()] == [("q", "1")]
        waiting = asyncio.ensure_future(anext(idle))
        await c.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 5)
        assert [[e.type for e in events] async for events in full] == [[("q", "0")], [("q", "1")]]


async def test_closing_an_iterator_ends_its_waiting_reader(tmp_path: Path) -> None:
    """aclose() ends a reader waiting in that iterator, as the client's close does (which
    cannot reach an iterator closed before it)."""
    async with running_server(tmp_path, database=":memory:") as server:
        c = await eventer.connect(url_of(server), "it", subscriptions=[("q", "*")])
        try:
            events = c.events()
            waiting = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0)  # the reader waits in the iterator's queue
            await events.aclose()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(waiting, 5)  # waited for good before
        finally:
            await c.close()


@pytest.mark.parametrize("in_a_task", [False, True])
async def test_a_callback_that_queries_is_answered_past_the_bound(
    tmp_path: Path, in_a_task: bool
) -> None:
    """A callback that waits on the client's own request needs its answer read: past
    ``events_queue_size`` (and ``max_concurrent`` waiting notifications) it still gets
    it at once, rather than the client stopping reading and the query its timeout."""
    async with running_server(tmp_path) as server:
        release = asyncio.Event()
        answered: list[int] = []
        failures: list[BaseException] = []

        async def querying_cb(client: eventer.Client, events: list[eventer.Event]) -> None:
            await release.wait()
            try:
                query = client.query(QueryLatestParams([("n", "0")]), timeout=3)
                # asyncio.wait_for runs it in a task of its own (on 3.11)
                result = await (asyncio.wait_for(query, 5) if in_a_task else query)
                answered.append(len(result.events))
            except Exception as exc:  # a timeout here is the failure this test is about
                failures.append(exc)

        reader, writer = await flooded_reader(server, querying_cb, 1100)
        async with writer:
            release.set()
            await wait_until(lambda: len(answered) + len(failures) == 1100, timeout=30)
        assert failures == [] and answered == [1] * 1100
        await reader.close()


async def test_a_task_a_callback_left_running_does_not_lift_the_bound(tmp_path: Path) -> None:
    """Only a callback's own requests (while it runs) lift the deliveries' bound: a task it
    started and left running queries with the bound in place."""
    async with running_server(tmp_path) as server:
        started: list[asyncio.Task[Any]] = []
        go = asyncio.Event()
        lifted: list[int] = []

        async def later(client: eventer.Client) -> None:
            await go.wait()  # runs on after the callback returned
            query = asyncio.ensure_future(client.query(QueryLatestParams([("n", "0")])))
            await asyncio.sleep(0)  # the query is now waiting for its answer
            lifted.append(client._deliveries.awaited_answers)
            await query

        def starts_a_task(client: eventer.Client, events: list[eventer.Event]) -> None:
            started.append(asyncio.ensure_future(later(client)))

        async with await eventer.connect(
            url_of(server), "c", subscriptions=[("n", "*")], events_cb=starts_a_task
        ) as client:
            await client.register([RegisterEvent(("n", "0"))], with_response=True)
            await wait_until(lambda: started)
            go.set()
            await asyncio.wait_for(started[0], 5)
        assert lifted == [0]


async def test_a_dropped_iterator_never_started_holds_nothing(tmp_path: Path) -> None:
    """``events()`` registered its queue at the call and freed it only when the generator
    ended, which one never started never does: once full it held delivery for good (12
    registrations reached ``events_cb`` 5 times)."""
    async with running_server(tmp_path, database=":memory:") as server:
        seen: list[list[eventer.Event]] = []
        async with await eventer.connect(
            url_of(server), "c", subscriptions=[("a", "*")], events_queue_size=4,
            events_cb=lambda _client, events: seen.append(events),
        ) as client:  # fmt: skip
            client.events()  # e.g. made before a registration that then failed
            gc.collect()
            for i in range(12):
                await client.register([json_event(("a", str(i)), i)], with_response=True)
            await wait_until(lambda: len(seen) == 12)
            assert not client._iterators


async def test_a_full_iterator_dropped_or_closed_lets_delivery_through(tmp_path: Path) -> None:
    """Iterators that took events, then filled up and were closed or dropped, release the
    delivery waiting for room in them (it used to wait for good); one read meanwhile gets
    everything."""
    async with running_server(tmp_path, database=":memory:") as server:
        seen: list[list[eventer.Event]] = []
        async with await eventer.connect(
            url_of(server), "c", subscriptions=[("a", "*")], events_queue_size=2,
            events_cb=lambda _client, events: seen.append(events),
        ) as client:  # fmt: skip
            kept, closed, dropped = client.events(), client.events(), client.events()
            got: list[list[eventer.Event]] = []

            async def read() -> None:
                async for events in kept:
                    got.append(events)

            reader = asyncio.ensure_future(read())
            for i in range(6):
                await client.register([json_event(("a", str(i)), i)], with_response=True)
                if i == 0:
                    for iterator in (closed, dropped):
                        assert [e.payload.data for e in await anext(iterator)] == [0]
            # 1 and 2 fill the two unread queues: delivery of 3 waits for room
            await wait_until(lambda: len(seen) == 4)
            await closed.aclose()
            with pytest.raises(StopAsyncIteration):
                await anext(closed)
            del dropped, iterator  # (the loop's variable holds it too)
            gc.collect()
            await wait_until(lambda: len(seen) == 6 and len(got) == 6)
            assert [e.payload.data for events in got for e in events] == list(range(6))
            assert client._iterators == {kept._queue}
        await asyncio.wait_for(reader, 5)  # ``kept`` ends with the client

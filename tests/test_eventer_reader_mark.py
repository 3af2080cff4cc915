"""The mark an ``events()`` iterator sets in its reader's task (so that the reader's own
queries lift the deliveries' bound, :class:`rpc.eventer.deliveries.ReaderIterator`) is
reset once the reader is done with the iterator: closed, or ended with the client. Before,
the last mark stayed set in the reader's context for the task's lifetime (inactive, but
holding the client's deliveries), over real sockets on 127.0.0.1 against our server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rpc import eventer
from rpc.eventer.deliveries import _DELIVERING
from tests.peers.eventer_helpers import json_event, running_server, url_of


async def read_one_list(client: eventer.Client, iterator: eventer.EventsIterator) -> None:
    """Register one event and take its notification from ``iterator``: the reader is then
    handling it (its requests lift the bound), as the mark says."""
    await client.register([json_event(("m", "1"), 1)], with_response=True)
    async with asyncio.timeout(5):
        events = await anext(iterator)
    assert [e.type for e in events] == [("m", "1")]
    assert client._deliveries.handling()  # the mark is set, and counts
    assert _DELIVERING.get() is not None


async def test_the_mark_is_reset_when_the_reader_closes_its_iterator(tmp_path: Path) -> None:
    async with running_server(tmp_path, system_events=False) as server:
        async with await eventer.connect(url_of(server), "r", subscriptions=[("m", "*")]) as client:

            async def reader() -> object:  # a task of its own: its context is the reader's
                iterator = client.events()
                await read_one_list(client, iterator)
                await iterator.aclose()
                return _DELIVERING.get()

            assert await asyncio.create_task(reader()) is None


async def test_the_mark_is_reset_when_the_iterator_ends_with_the_client(tmp_path: Path) -> None:
    async with running_server(tmp_path, system_events=False) as server:
        client = await eventer.connect(url_of(server), "r", subscriptions=[("m", "*")])

        async def reader() -> tuple[int, object]:
            iterator = client.events()
            await read_one_list(client, iterator)
            await client.close()
            async with asyncio.timeout(5):
                rest = [events async for events in iterator]  # ends: the client closed
            return len(rest), _DELIVERING.get()

        assert await asyncio.create_task(reader()) == (0, None)

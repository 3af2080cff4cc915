"""Our Eventer client's undelivered notifications are bounded in bytes, not only in count:
past ``events_queue_bytes`` (as received) it stops reading, over real sockets on
127.0.0.1 against our Eventer server. Before, only the count bounded them: 1,024 queued
plus 1,024 waiting tasks, whatever their size (32 GiB at a max_size of 16 MiB)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rpc import eventer
from rpc.eventer.common import EventPayloadBinary, QueryLatestParams, RegisterEvent
from tests.peers.eventer_helpers import running_server, url_of, wait_until

KIB = 1024
EVENT = 256 * KIB
"""Each notification carries one event of this many payload bytes."""

BOUND = 1024 * KIB
"""The reader's ``events_queue_bytes`` where one is given (the default is 16 MiB)."""


def big(i: int) -> RegisterEvent:
    return RegisterEvent(("n", str(i)), None, EventPayloadBinary("b", b"x" * EVENT))


async def flood(server: eventer.EventerServer, count: int) -> eventer.Client:
    """A writer that registered ``count`` big events, one notification each (no wait for
    their commit); to be closed by the caller."""
    writer = await eventer.connect(url_of(server), "writer")
    for i in range(count):
        await writer.register([big(i)])
    return writer


@pytest.mark.parametrize(
    ("bound", "count"),
    [(None, 100), (BOUND, 40)],
    ids=["default-16MiB", "1MiB"],
)
async def test_a_slow_callback_holds_at_most_events_queue_bytes(
    tmp_path: Path, bound: int | None, count: int
) -> None:
    """A callback that does not return: the client queues notifications up to
    ``events_queue_bytes`` (the one that passes it included) and stops reading, rather
    than queueing all of them (25 MiB, 10 MiB: well under the count bound, 1,024, and the
    server's ``max_client_backlog``, 64 MiB); once the callback returns it gets every
    event, in order."""
    options: dict[str, Any] = {}
    if bound is None:  # the default
        bound = 16 * 1024 * KIB
    else:
        options["events_queue_bytes"] = bound
    async with running_server(tmp_path, database=":memory:") as server:
        release = asyncio.Event()
        delivered: list[str] = []

        async def slow_cb(_client: eventer.Client, events: list[eventer.Event]) -> None:
            await release.wait()
            delivered.extend(e.type[1] for e in events)

        reader = await eventer.connect(
            url_of(server), "reader", subscriptions=[("n", "*")], events_cb=slow_cb,
            **options,
        )  # fmt: skip
        connection = reader.connection.connection if reader.connection else None
        assert connection is not None
        async with await flood(server, count):
            # held: room is gone and the connection stopped reading; or (before) all queued
            await wait_until(
                lambda: (
                    reader._deliveries.qsize() >= count - 1
                    or (
                        not reader._deliveries.room.is_set()
                        and not connection.transport.is_reading()
                    )
                ),
                timeout=10,
            )
            queued = reader._deliveries.qsize()
            assert queued * EVENT <= bound + EVENT, f"{queued} notifications of 256 KiB queued"
            assert reader.queued_bytes < bound + EVENT + 4 * KIB  # envelope of one
            release.set()
            await wait_until(lambda: len(delivered) == count, timeout=20)
        assert delivered == [str(i) for i in range(count)]
        assert reader.queued_bytes == 0
        await reader.close()


async def test_a_callback_that_queries_is_answered_past_the_bytes(tmp_path: Path) -> None:
    """A callback that waits on the client's own query while the client holds its input for
    the bytes queued: the hold is lifted while it waits, so it gets its answer at once, as
    past the count (the answer would wait behind the held notifications)."""
    async with running_server(tmp_path, database=":memory:") as server:
        release = asyncio.Event()
        answered: list[int] = []

        async def querying_cb(client: eventer.Client, events: list[eventer.Event]) -> None:
            await release.wait()
            result = await client.query(QueryLatestParams([("n", "0")]), timeout=3)
            answered.append(len(result.events))

        reader = await eventer.connect(
            url_of(server), "reader", subscriptions=[("n", "*")], events_cb=querying_cb,
            events_queue_bytes=BOUND,
        )  # fmt: skip
        connection = reader.connection.connection if reader.connection else None
        assert connection is not None
        async with await flood(server, 12):
            await wait_until(
                lambda: (
                    not reader._deliveries.room.is_set() and not connection.transport.is_reading()
                )
            )
            release.set()
            await wait_until(lambda: len(answered) == 12, timeout=20)
        assert answered == [1] * 12  # the latest ("n", "0")
        await reader.close()

"""Our Eventer client's ``events()`` iterators are bounded in bytes, not only in count:
one whose reader is slow queues at most ``events_queue_bytes`` (as received; a larger list
alone), then holds up delivery and the connection stops reading, as past its count, over
real sockets on 127.0.0.1 against our Eventer server and hat-event's. Before, only the
count (1,024 lists) bounded it: 16 GiB at a max_size of 16 MiB."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hat.drivers import net
from hat.event import common as hat
from hat.event import eventer as hat_eventer

from rpc import eventer
from rpc.eventer.common import EventPayloadBinary, RegisterEvent
from tests.peers.eventer_helpers import free_port, running_server, url_of, wait_until

KIB = 1024
ENVELOPE = 4 * KIB
"""More than a notification of one event adds to its payload as received."""


def big(i: int, size: int) -> RegisterEvent:
    return RegisterEvent(("n", str(i)), None, EventPayloadBinary("b", b"x" * size))


async def read_slowly(
    url: str,
    publish: Callable[[int, int], Awaitable[None]],
    bound: int | None,
    event: int,
    count: int,
) -> None:
    """A client subscribed to ``("n", "*")`` whose iterator is read only once it is full,
    while ``publish(count, event)`` sends it ``count`` notifications of one ``event``-byte
    event each, ``("n", str(i))``: the iterator never holds more than ``events_queue_bytes``
    (``most`` lists; one when a list is larger than the bound), delivery (``events_cb``)
    then waits for it and the client stops reading; the reader gets every list, in order."""
    options: dict[str, Any] = {}
    if bound is None:  # the default
        bound = 16 * 1024 * KIB
    else:
        options["events_queue_bytes"] = bound
    most = max(bound // event, 1)  # lists that fit (a list larger than the bound: alone)
    seen: list[int] = []  # lists handed to events_cb: each then goes to the iterator
    reader = await eventer.connect(
        url, "reader", subscriptions=[("n", "*")],
        events_cb=lambda _client, events: seen.append(len(events)), **options,
    )  # fmt: skip
    connection = reader.connection.connection if reader.connection else None
    assert connection is not None
    iterator = reader.events()

    def held() -> bool:
        return not reader._deliveries.room.is_set() and not connection.transport.is_reading()

    try:
        await publish(count, event)
        # unread: held (before: every list queued in the iterator, delivered to events_cb)
        await wait_until(lambda: len(seen) == count or held(), timeout=10)
        # all but the list in delivery's hands (if any) are in the iterator
        assert len(seen) - 1 <= most, f"{len(seen) - 1} lists of {event} bytes queued"
        assert held()
        assert iterator.queued_bytes <= max(bound, event + ENVELOPE)
        got: list[str] = []
        while len(got) < count:
            # slow: reads once it is full again (one more waits) or all were delivered
            await wait_until(lambda: len(seen) == count or len(seen) - len(got) - 1 >= most)
            in_iterator = len(seen) - len(got) - 1  # at least
            assert in_iterator <= most, f"{in_iterator} lists of {event} bytes queued"
            assert iterator.queued_bytes <= max(bound, event + ENVELOPE)
            events = await anext(iterator)
            got.extend(e.type[1] for e in events)
        assert got == [str(i) for i in range(count)]
        assert iterator.queued_bytes == 0
    finally:
        await reader.close()


@pytest.mark.parametrize(
    ("bound", "event", "count"),
    [(None, 300 * KIB, 140), (1024 * KIB, 300 * KIB, 40), (256 * KIB, 300 * KIB, 8)],
    ids=["default-16MiB", "1MiB", "lists-larger-than-the-bound"],
)
async def test_a_slow_iterator_holds_at_most_events_queue_bytes(
    tmp_path: Path, bound: int | None, event: int, count: int
) -> None:
    """Against our server, a writer registering the events; far fewer than the count
    bound (1,024 lists) and than the server's ``max_client_backlog`` (64 MiB)."""
    async with running_server(tmp_path, database=":memory:") as server:
        async with await eventer.connect(url_of(server), "writer") as writer:

            async def register(count: int, event: int) -> None:
                for i in range(count):
                    await writer.register([big(i, event)])

            await read_slowly(url_of(server), register, bound, event, count)


@pytest.mark.interop
@pytest.mark.parametrize(
    ("bound", "event", "count"),
    [(1024 * KIB, 300 * KIB, 40), (256 * KIB, 300 * KIB, 8)],
    ids=["1MiB", "lists-larger-than-the-bound"],
)
async def test_a_slow_iterator_holds_at_most_events_queue_bytes_of_hat_server(
    bound: int, event: int, count: int
) -> None:
    """Against hat-event 0.9.44's ``eventer.listen``, notifying the events itself."""
    port = free_port()
    server = await hat_eventer.listen(
        net.TcpAddress("127.0.0.1", port), status=hat.Status.OPERATIONAL
    )

    async def notify(count: int, event: int) -> None:
        for i in range(count):
            payload = hat.EventPayloadBinary("b", b"x" * event)
            pushed = hat.Event(hat.EventId(1, 1, i + 1), ("n", str(i)), hat.now(), None, payload)
            await server.notify_events([pushed], persisted=False)

    try:
        url = f"tcp+sbs://127.0.0.1:{port}?dialect=HatChatter"
        await read_slowly(url, notify, bound, event, count)
    finally:
        await server.async_close()


@pytest.mark.parametrize("bounds", [{"events_queue_size": 0}, {"events_queue_bytes": 0}])
async def test_queue_bounds_below_one_are_refused(bounds: dict[str, int]) -> None:
    """0 once meant an unbounded iterator queue (asyncio.Queue's 0): now a ValueError,
    raised before any connection is tried."""
    with pytest.raises(ValueError, match="at least 1"):
        await eventer.connect("tcp+sbs://127.0.0.1:9", "bounds", **bounds)

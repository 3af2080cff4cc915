"""The watch on a held Eventer connection (:mod:`rpc.eventer.hold_watch`) is event-driven:
while the client holds the server's input (an ``events()`` iterator not read) and the
server stays open, nothing of the watch runs, unread notifications in the socket included;
the server's FIN wakes it at once, and the rest is read. Its epoll fd lives only while the
hold lasts, however the hold ends. Real sockets on 127.0.0.1 against our Eventer server,
on asyncio and uvloop.

Before (dd32f6f), the watch looked at the socket every 0.5 s (a timer and a ``poll`` call
per look, while holding): the first test fails on it (the watch ran during the window)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from rpc import eventer
from rpc.eventer import EventerServer, hold_watch
from rpc.eventer.iterators import EventsIterator
from tests.peers.eventer_helpers import json_event, running_server, url_of, wait_until
from tests.test_eventer_held_close import peer_of, reading

pytestmark = [
    pytest.mark.both_loops,
    pytest.mark.skipif(not hasattr(select, "epoll"), reason="the watch needs select.epoll"),
]

QUIET = 1.0
"""Seconds the held connection is watched with the server open (the scenario, not a
synchronisation): the 0.5-s looks of before ran at least once in any such window."""


def watch_suspended() -> bool:
    """A task awaits :func:`hold_watch.watch` (spawned by the connection, under its
    notification runner), started and suspended."""
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        while coro is not None and hasattr(coro, "cr_code"):
            if coro.cr_code is hold_watch.watch.__code__:
                return coro.cr_frame is not None and coro.cr_await is not None
            coro = coro.cr_await
    return False


def epolls() -> int:
    """The epoll instances this process holds open (the loop's own among them)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own fd, gone
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]"
    return count


async def held_client(
    server: EventerServer, **options: Any
) -> tuple[eventer.Client, EventsIterator]:
    """A client whose unread ``events()`` iterator holds the server's input (11
    notifications sent, 3 of them after the hold began: left unread in its socket)."""
    client = await eventer.connect(
        url_of(server), "held", subscriptions=[("h", "*")], events_queue_size=1, **options
    )
    iterator = client.events()
    for i in range(8):
        await server.register([json_event(("h", str(i)), i)])
    await wait_until(lambda: not reading(client))
    await wait_until(watch_suspended)
    for i in range(8, 11):  # sent, and left in our socket: they must not wake the watch
        await server.register([json_event(("h", str(i)), i)])
    return client, iterator


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[EventerServer]:
    async with running_server(tmp_path, system_events=False) as server:
        yield server


async def test_nothing_runs_while_held_until_the_server_closes(server: EventerServer) -> None:
    """Counted by a profile hook (every Python call of this thread, the loop's): no
    function of ``hold_watch`` runs in :data:`QUIET` s of holding, no timer, no look, no
    wake-up by the unread data; then the server's FIN runs it, the client reads the rest
    (the 3 notifications unread in its socket delivered, not aborted) and the close is seen
    within the bound."""
    client, held = await held_client(server, ping_interval=None)  # no Pings: the FIN alone tells
    peer = peer_of(client)
    runs: list[str] = []

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_filename == hold_watch.__file__:
            runs.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        await asyncio.sleep(QUIET)  # the window watched (module doc): no synchronisation
        quiet = list(runs)
        await server.close()
        async with asyncio.timeout(1):  # before: within 0.5 s, at the next look
            await asyncio.shield(client.closed)
        async with asyncio.timeout(3):
            got = [e.type[1] async for events in held for e in events]
    finally:
        sys.setprofile(previous)
        await held.aclose()  # delivery held no more: the client's close need not wait
        await client.close()
    assert quiet == [], f"the watch ran while nothing happened: {quiet}"
    assert runs, "the server's FIN did not run the watch"
    assert peer.gave_up is None  # the FIN let the connection go: not aborted
    assert got == [str(i) for i in range(11)]  # the 3 left in the socket read, not dropped


@pytest.mark.parametrize("end", ["room", "server closes", "client closes"])
async def test_the_epoll_is_closed_when_the_hold_ends(server: EventerServer, end: str) -> None:
    """One epoll fd more while the client holds, none once the hold ends: room comes (the
    iterator read to its end, the hold taken up again on the way), the server closes, or
    the client closes."""
    base = epolls()
    client, held = await held_client(server)
    try:
        await wait_until(lambda: epolls() == base + 1, timeout=2)
        if end == "room":
            got: list[str] = []
            async with asyncio.timeout(5):
                while len(got) < 11:
                    got.extend(e.type[1] for e in await anext(held))
            assert got == [str(i) for i in range(11)]
            assert client.is_connected  # room came: the watch let the connection be
        elif end == "server closes":
            await server.close()
            async with asyncio.timeout(2):
                await asyncio.shield(client.closed)
        else:
            await client.close()
        await wait_until(lambda: epolls() == base, timeout=2)
    finally:
        await held.aclose()  # delivery held no more: the client's close need not wait
        await client.close()

"""Defects found by helper-157 reviewing 5d6757f..b11d5c7."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from rpc import eventer
from tests.peers.eventer_helpers import json_event, running_server, url_of, wait_until


async def test_a_status_callback_that_closes_its_client_does_not_wait_for_a_queued_ack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``events_ack``, a status notification and then an events one (sent without
    waiting: a status needs no ack): a status callback that closes its client (stop once
    the server says so) waited for the queued events' ack handler, which waited for the
    delivery task, which ran that callback: the close took the whole 1-s drain and cut
    the handler with a warning. close() drops what is not delivered: it no longer waits
    for those notifications' acks either."""
    async with running_server(tmp_path, events_ack=True) as server:
        took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def stop_on_status(client: eventer.Client, status: eventer.Status) -> None:
            if status is not eventer.Status.STARTING or took.done():
                return  # the init's, or after the close
            await wait_until(lambda: client._deliveries.qsize() == 2)  # the rest, queued
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                await client.close()
            finally:
                took.set_result(loop.time() - start)

        client = await eventer.connect(
            url_of(server), "once", subscriptions=[("a",)], status_cb=stop_on_status
        )
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            await server.set_status(eventer.Status.STARTING)
            await server.set_status(eventer.Status.OPERATIONAL)
            await server.register([json_event(("a",))])
            waited = await asyncio.wait_for(took, 5)
        assert client.closed.done()
        cut = [r.getMessage() for r in caplog.records if "are cut" in r.getMessage()]
        assert cut == []
        assert waited < 0.5, waited


async def test_a_callback_that_closes_its_client_while_delivery_is_full_does_not_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without acks, past ``events_queue_size`` notifications the connection runs a task
    that waits for room in the deliveries, which the close's drain waits for: a callback
    that closed its client then waited for itself (the delivery task runs it)."""
    async with running_server(tmp_path) as server:
        took: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def stop_at_first(client: eventer.Client, _events: list[eventer.Event]) -> None:
            if took.done():
                return
            await wait_until(lambda: not client._deliveries.room.is_set())  # full: held
            loop = asyncio.get_running_loop()
            start = loop.time()
            try:
                await client.close()
            finally:
                took.set_result(loop.time() - start)

        client = await eventer.connect(
            url_of(server),
            "once",
            subscriptions=[("a",)],
            events_cb=stop_at_first,
            events_queue_size=2,
        )
        with caplog.at_level(logging.WARNING, logger="peerwire.rpc"):
            for i in range(6):
                await server.register([json_event(("a",), i)])
            waited = await asyncio.wait_for(took, 5)
        assert client.closed.done()
        cut = [r.getMessage() for r in caplog.records if "are cut" in r.getMessage()]
        assert cut == []
        assert waited < 0.5, waited

"""The Eventer client under the conditions of real deployments (found by helper-113): a
client registering without response to a server that has stopped reading, and a query whose
answer is over the client's ``max_size`` on a reconnecting client."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from rpc import eventer
from rpc.eventer import EventerServer
from tests.peers.eventer_helpers import json_event, server_config
from tests.test_eventer_cli import start

HIGH_WATER = 256 * 1024
"""The core's default ``high_water`` (docs/limits.md)."""


# --- a server that stops reading ----------------------------------------------------------


async def test_registering_without_response_waits_for_a_server_that_stopped_reading(
    tmp_path: Path,
) -> None:
    """``await client.register(events)`` (no response) wrote at once, however much was
    unsent: against a server that stopped reading (stopped, swapped out, a stalled
    network) 300 registrations of 64 KiB left about 19 MiB buffered in the client within a
    fraction of a second, unbounded until the connection's liveness limit (40 s). It
    must wait while the connection's output is above the core's ``high_water``, as
    ``Peer.drain()`` does."""
    (tmp_path / "c.json").write_text(
        json.dumps({"listen": "tcp+sbs://127.0.0.1:0", "database": ":memory:"})
    )
    proc, url = await start(tmp_path / "c.json")
    try:
        client = await eventer.connect(url, "flood", timeout=2)
        try:
            proc.send_signal(signal.SIGSTOP)
            event = json_event(("flood",), "x" * 65536)

            async def flood() -> None:
                for _ in range(300):
                    await client.register([event])

            task = asyncio.ensure_future(flood())
            await asyncio.wait([task], timeout=2)  # the flood's time to run, not a sync
            connection = client.connection
            assert connection is not None
            buffered = connection.write_buffer_size
            task.cancel()
            assert buffered <= HIGH_WATER + 2 * 70_000, f"{buffered} bytes unsent, unbounded"
        finally:
            proc.send_signal(signal.SIGCONT)
            await client.close()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 20)


# --- a query whose answer the client refuses ----------------------------------------------


async def test_a_query_whose_result_exceeds_max_size_is_not_resent_on_every_reconnect(
    tmp_path: Path,
) -> None:
    """A reconnecting client whose ``max_size`` is below the server's ``max_message_size``
    closes the connection on the oversized answer, and since a query is sent again after a
    reconnect, got the same answer again, reconnect after reconnect, until its timeout
    (7 connections in 3 s, each a CONNECTED and DISCONNECTED event on the server and a
    gap in its notifications); the caller then got ``not connected within 3 s
    (reconnecting)``, not the reason. The answer was not lost: the query must fail with
    the size error (as it does without ``reconnect``), not be sent again."""
    config = server_config(tmp_path, max_message_size=8 * 1024 * 1024)
    async with EventerServer(config) as server:
        for i in range(6):
            await server.register([json_event(("big", str(i)), "x" * 1_000_000)])
        client = await eventer.connect(
            server.urls[0],
            "small",
            reconnect=True,
            reconnect_delay=0.05,
            timeout=3,
            max_size=4 * 1024 * 1024,
        )
        try:
            with pytest.raises(Exception) as raised:
                await client.query(eventer.QueryTimeseriesParams(event_types=[("big", "*")]))
        finally:
            await client.close()
        connected = await server.query(
            eventer.QueryTimeseriesParams(event_types=[("event", "?", "eventer", "small")])
        )
        statuses = [e.payload.data for e in connected.events]  # type: ignore[union-attr]
    assert "max_size" in str(raised.value), repr(raised.value)
    # the first connection, and at most the one the client made before it was closed
    assert statuses.count("CONNECTED") <= 2, statuses

"""The Eventer client where a connection is lost or never answers.

- Registrations sent without response on a connection that had already dropped (the
  client had not noticed yet) were lost without a word. Now the server confirms them (its
  answer to a later request, or a probe query, :mod:`rpc.eventer.confirm`): those a
  dropped connection did not confirm are counted and logged.
- ``connect`` to a server that accepts TCP but never answers raised rpc's
  ``RequestTimeout`` ("HatEventer.MsgInitReq: no result within ..."); now
  ``EventerInitTimeout`` (still a RequestTimeout) says the handshake went unanswered."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer import confirm
from tests.peers.eventer_helpers import json_event, port_of, running_server, url_of, wait_until
from tests.tcp_proxy import Proxy

BEFORE, AFTER = 10, 5


async def test_registrations_without_response_lost_with_their_connection_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="peerwire.eventer.client")
    confirm.drops.reset()  # the process-wide rate limit: earlier tests may have used it
    query = eventer.QueryTimeseriesParams(event_types=[("f",)], max_results=100)
    async with running_server(tmp_path, system_events=False) as server:
        async with Proxy(port_of(server)) as proxy:
            client = await eventer.connect(
                f"tcp+sbs://127.0.0.1:{proxy.port}",
                "fire-and-forget",
                reconnect=True,
                reconnect_delay=0.05,
                timeout=2,
            )
            try:
                for i in range(BEFORE):
                    assert await client.register([json_event(("f",), i)]) is None
                assert client.awaiting_confirmation == BEFORE
                # a query's answer confirms every registration sent before it
                assert len((await client.query(query)).events) == BEFORE
                assert client.awaiting_confirmation == 0
                proxy.drop()  # both sides cut; the client has not read the reset yet
                for i in range(BEFORE, BEFORE + AFTER):
                    assert await client.register([json_event(("f",), i)]) is None
                    await asyncio.sleep(0)  # one loop turn: the write that finds the reset
                await client.wait_connected(5)
                stored = len((await client.query(query)).events)
                assert client.awaiting_confirmation == 0
            finally:
                await client.close()
    lost = BEFORE + AFTER - stored
    assert lost >= 1, "nothing was lost: the scenario proves nothing"
    # those confirmed before the drop are not counted, those it lost are
    assert (client.unconfirmed_registrations, client.unconfirmed_events) == (lost, lost)
    warnings = [r.getMessage() for r in caplog.records if "may be lost" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"confirmed {lost} registrations sent without response ({lost} events)" in warnings[0]


async def test_a_probe_confirms_registrations_no_request_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a later request, a probe confirms them (after ``PROBE_DELAY``): a drop
    then reports nothing."""
    caplog.set_level(logging.WARNING, logger="peerwire.eventer.client")
    async with running_server(tmp_path, system_events=False) as server:
        async with Proxy(port_of(server)) as proxy:
            url = f"tcp+sbs://127.0.0.1:{proxy.port}"
            client = await eventer.connect(url, "quiet", reconnect=True, reconnect_delay=0.05)
            try:
                for i in range(3):
                    await client.register([json_event(("q",), i)])
                await wait_until(
                    lambda: client.awaiting_confirmation == 0, timeout=confirm.PROBE_DELAY + 5
                )
                proxy.drop()
                await wait_until(lambda: not client.is_connected)
                await client.wait_connected(5)
            finally:
                await client.close()
    assert (client.unconfirmed_registrations, client.unconfirmed_events) == (0, 0)
    assert "may be lost" not in caplog.text


async def test_a_server_that_never_answers_the_handshake_fails_connect_clearly() -> None:
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, then never a byte: a hung server

    hung = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(eventer.EventerInitTimeout) as caught:
            await eventer.connect(f"tcp+sbs://127.0.0.1:{port}", "patient", timeout=0.3)
    finally:
        for writer in held:
            writer.close()
        hung.close()
        await hung.wait_closed()
    assert loop.time() - started < 0.3 + 2
    assert str(caught.value) == (
        f"eventer server 127.0.0.1:{port} accepted the connection but did not answer its "
        "handshake (init) within 0.3 s"
    )
    assert isinstance(caught.value, rpc.RequestTimeout)  # what callers caught before


async def test_a_query_answered_with_an_error_confirms_the_registrations_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server answers a query, even with an error (a latest result over its
    max_message_size), only after reading the registrations sent before it on the
    connection: that answer confirms them as a result does (helper-124's review: before,
    query() raised QueryError without noting it, and a drop reported them as possibly
    lost)."""
    monkeypatch.setattr(confirm, "PROBE_DELAY", 60.0)  # no probe confirms them meanwhile
    async with running_server(tmp_path, system_events=False, max_message_size=4096) as server:
        client = await eventer.connect(url_of(server), "errors")
        try:
            for name in ("1", "2"):  # together larger than one message: latest fails
                await client.register([json_event(("big", name), "x" * 2500)], with_response=True)
            for i in range(3):
                await client.register([json_event(("small",), i)])
            assert client.awaiting_confirmation == 3
            with pytest.raises(eventer.QueryError):
                await client.query(eventer.QueryLatestParams([("big", "*")]))
            assert client.awaiting_confirmation == 0
        finally:
            await client.close()

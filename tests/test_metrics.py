"""Prometheus metrics: a scripted mix of calls, errors, retries, refused connections, raw
bytes and a protocol violation against a real server, then the real exposition scraped over
HTTP and parsed back with prometheus-client's parser: every counter matches what was done."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import rpc
from rpc.metrics import Metrics, start_http_server
from tests.rpc_helpers import wait_until as wait_for
from wire import gotalk


class Scrape:
    """One scrape of ``/metrics``: sample values by name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[sample.name, frozenset(sample.labels.items())] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """The sum over every sample of ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return Scrape(response.read().decode())


@pytest.fixture
def exposed() -> Iterator[tuple[Metrics, int]]:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    server, thread = start_http_server("127.0.0.1", 0, registry=registry)
    try:
        yield metrics, server.server_port
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()  # its listening socket (shutdown() only stops the loop)


def scripted_registry(notes: list[Any]) -> rpc.Registry:
    reg = rpc.Registry()
    busy = {"refusals": 2}

    @reg.use
    async def policy(call: rpc.Call, call_next: Any) -> Any:
        if call.op == "secret":
            raise rpc.Rejected("no")
        if call.op == "busy" and busy["refusals"]:
            busy["refusals"] -= 1
            raise rpc.RetryLater("busy", 0.01)
        return await call_next(call)

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("busy")
    def busy_op(value: Any) -> Any:
        return value

    @reg.handle("secret")
    def secret(value: Any) -> Any:
        return value

    @reg.handle("fail")
    async def fail(_: Any) -> None:
        raise RuntimeError("fails")

    @reg.handle("count")
    async def count(n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        notes.append(value)

    return reg


async def test_scripted_mix_matches_the_exposition(exposed: tuple[Metrics, int]) -> None:
    metrics, port = exposed
    notes: list[Any] = []
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0",
        registry=scripted_registry(notes),
        metrics=metrics,
        max_connections=2,
        heartbeat_interval=None,
    ) as server:
        url = str(server.url)
        async with rpc.connect(url, registry=rpc.Registry(), metrics=metrics) as peer:
            for i in range(5):
                assert await peer.request("echo", i) == i
            for _ in range(2):
                with pytest.raises(rpc.RemoteError, match="fails"):
                    await peer.request("fail")
            with pytest.raises(rpc.RemoteError, match="unknown operation"):
                await peer.request("no-such-op")
            with pytest.raises(rpc.RemoteError, match="no"):
                await peer.request("secret", 1)
            assert await peer.request("busy", "x") == "x"  # after two retry results
            assert [x async for x in peer.stream("count", value=3)] == [0, 1, 2]
            peer.notify("note", 1)
            peer.notify("note", 2)
            await wait_for(lambda: len(notes) == 2)

            during = scrape(port)
            assert during.value("peerwire_connections_open", protocol="gotalk") == 1

            async with rpc.connect(url, registry=rpc.Registry()):
                await wait_for(lambda: len(server.peers) == 2)
                for _ in range(3):  # past max_connections: closed at once
                    reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
                    assert await reader.read() == b""
                    writer.close()
            await wait_for(lambda: len(server.peers) == 1)

        # one raw connection whose bytes we count ourselves, then a protocol violation
        await wait_for(lambda: not server.peers)
        before = scrape(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        request = gotalk.VERSION + gotalk.encode(gotalk.Request(b"0001", "echo", b'"raw"'))
        writer.write(request)
        expected_reply = gotalk.VERSION + gotalk.encode(gotalk.Result(b"0001", b'"raw"'))
        reply = await reader.readexactly(len(expected_reply))
        assert reply == expected_reply
        writer.close()
        await wait_for(lambda: not server.peers)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        writer.write(gotalk.VERSION + b"Z garbage")
        await reader.read()
        writer.close()
        await wait_for(lambda: not server.peers)

    after = scrape(port)
    server_side = {"side": "server", "protocol": "gotalk"}
    client_side = {"side": "client", "protocol": "gotalk"}

    def requests(side: dict[str, str], op: str, kind: str = "request") -> float:
        return after.value("peerwire_requests_total", op=op, kind=kind, **side)

    assert requests(server_side, "echo") == 6  # five, and the raw connection's
    assert requests(client_side, "echo") == 5
    assert requests(server_side, "fail") == requests(client_side, "fail") == 2
    assert requests(server_side, "(unknown)") == 1
    assert requests(client_side, "no-such-op") == 1
    assert requests(server_side, "secret") == requests(client_side, "secret") == 1
    assert requests(server_side, "busy") == requests(client_side, "busy") == 3
    assert requests(server_side, "count") == requests(client_side, "count") == 1
    assert requests(server_side, "note", "notification") == 2
    assert after.value("peerwire_requests_total", op="note", side="client") == 0

    def errors(side: dict[str, str], op: str, error: str) -> float:
        return after.value("peerwire_errors_total", op=op, error=error, **side)

    assert errors(server_side, "fail", "handler") == 2
    assert errors(client_side, "fail", "remote") == 2
    assert errors(server_side, "(unknown)", "unknown_operation") == 1
    assert errors(client_side, "no-such-op", "remote") == 1
    assert errors(server_side, "secret", "rejected") == 1
    assert after.value("peerwire_errors_total", **server_side) == 4
    assert after.value("peerwire_errors_total", **client_side) == 4
    assert after.value("peerwire_retries_total", op="busy", **server_side) == 2
    assert after.value("peerwire_retries_total", op="busy", **client_side) == 2
    assert after.value("peerwire_retries_total") == 4

    total_server = 6 + 2 + 1 + 1 + 3 + 1 + 2
    assert after.value("peerwire_request_duration_seconds_count", **server_side) == total_server
    total_client = 5 + 2 + 1 + 1 + 3 + 1
    assert after.value("peerwire_request_duration_seconds_count", **client_side) == total_client
    assert after.value("peerwire_requests_in_flight") == 0

    assert after.value("peerwire_connections_accepted_total", protocol="gotalk") == 4
    assert after.value("peerwire_connections_refused_total", protocol="gotalk") == 3
    assert after.value("peerwire_connections_open", protocol="gotalk") == 0
    violations = after.value("peerwire_protocol_violations_total", protocol="gotalk")
    assert violations == 1
    assert (
        after.value(
            "peerwire_protocol_violations_total", protocol="gotalk", kind="malformed_message"
        )
        == 1
    )
    received = after.value("peerwire_received_bytes_total") - before.value(
        "peerwire_received_bytes_total"
    )
    sent = after.value("peerwire_sent_bytes_total") - before.value("peerwire_sent_bytes_total")
    assert received == len(request) + len(gotalk.VERSION + b"Z garbage")
    garbage_answer = gotalk.VERSION + gotalk.encode(gotalk.Fault(gotalk.ErrorCode.INVALID_MESSAGE))
    assert sent == len(expected_reply) + len(garbage_answer)


async def test_chatter_and_tls_servers_are_counted(exposed: tuple[Metrics, int], pki: Any) -> None:
    """Chatter over TLS: calls counted under protocol="chatter", plaintext bytes counted."""
    from transports.stream import client_ssl_context, server_ssl_context

    metrics, port = exposed
    reg = rpc.Registry()

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    client_ctx = client_ssl_context(cafile=pki.ca)
    async with rpc.serve(
        "ssl+sbs://127.0.0.1:0", registry=reg, ssl=server_ctx, metrics=metrics
    ) as server:
        url = f"ssl+sbs://localhost:{server.url.port}?dialect=HatChatter"
        async with rpc.connect(url, ssl=client_ctx) as peer:
            for i in range(4):
                assert await peer.request("echo", i) == i
            assert scrape(port).value("peerwire_connections_open", protocol="chatter") == 1
    after = scrape(port)
    assert after.value("peerwire_requests_total", op="echo", side="server", protocol="chatter") == 4
    assert after.value("peerwire_connections_accepted_total", protocol="chatter") == 1
    assert after.value("peerwire_received_bytes_total", protocol="chatter") > 0
    assert after.value("peerwire_sent_bytes_total", protocol="chatter") > 0
    assert after.value("peerwire_connections_open", protocol="chatter") == 0

"""Our Eventer server against clients that misbehave, mostly bare Chatter peers speaking
HatEventer bytes, and a raw socket: a wrong token, protocol violations, registrations
that cannot be decoded, a client that stops reading and one with too many queries in
flight."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import rpc
from rpc import eventer
from rpc.eventer import common
from rpc.eventer.common import (
    EventId,
    EventPayloadJson,
    QueryLatestParams,
    QueryServerParams,
    Status,
)
from tests.chatter_socket import ChatterSocket
from tests.peers.eventer_helpers import (
    init_bytes,
    json_event,
    port_of,
    raw_peer,
    running_server,
    url_of,
    wait_until,
)
from wire import schemas
from wire.chatter import Dialect
from wire.sbs import encode_integer


async def test_token_refusal_answers_then_closes(tmp_path: Path) -> None:
    async with running_server(tmp_path, token="secret") as server:
        async with await eventer.connect(url_of(server), "no/token") as client:
            assert client.status is Status.OPERATIONAL
        async with await eventer.connect(url_of(server), "ok", client_token="secret") as client:
            assert client.status is Status.OPERATIONAL
        with pytest.raises(eventer.EventerInitError, match="invalid client token"):
            await eventer.connect(url_of(server), "bad", client_token="wrong")

        # a client that does not close: the server closes after its 0.5 s grace period
        peer = await raw_peer(server)
        started = time.monotonic()
        res = await peer.request(common.MSG_INIT_REQ, init_bytes(token="wrong"), raw=True)
        assert common.decode(common.MSG_INIT_RES, res) == ("error", "invalid client token")
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)
        assert 0.4 <= time.monotonic() - started < 2.0
        assert not server.clients


async def test_protocol_violations_close_the_connection(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        register = common.encode(common.MSG_REGISTER_REQ, [])
        peer = await raw_peer(server)
        peer.notify(common.MSG_REGISTER_REQ, register)  # before init
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        with pytest.raises(rpc.RpcError):
            await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        peer.notify(common.MSG_STATUS_NOTIFY, b"\x80")  # a server's message
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)

        async with await eventer.connect(url_of(server), "q") as client:
            with pytest.raises(rpc.ConnectionClosed):  # the reference closes too
                await client.query(QueryServerParams(1, last_event_id=EventId(2, 1, 1)))


async def test_an_init_with_a_huge_array_count_is_refused_at_once(tmp_path: Path) -> None:
    """A MsgInitReq whose subscriptions claim 2**30 entries in a few bytes is refused at
    once (hat-sbs alone would allocate the array first: 2 s of the loop), its connection
    closed, and the server goes on serving."""
    async with running_server(tmp_path) as server:
        peer = await raw_peer(server)
        bogus = b"\x80\x80" + encode_integer(2**30)  # name, no token, 2**30 subscriptions
        started = time.monotonic()
        res = await peer.request(common.MSG_INIT_REQ, bogus, raw=True)
        assert time.monotonic() - started < 0.5  # 2 s before
        status, why = common.decode(common.MSG_INIT_RES, res)
        assert status == "error" and "Array" in why, why
        await asyncio.wait_for(asyncio.shield(peer.closed), 3)  # refused: closed
        async with await eventer.connect(url_of(server), "after") as client:
            assert client.status is Status.OPERATIONAL


async def test_bad_registrations_fail_without_side_effects(tmp_path: Path) -> None:
    async with running_server(tmp_path, system_events=False) as server:
        peer = await raw_peer(server)
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        bad_json = common.encode(
            common.MSG_REGISTER_REQ,
            [
                {
                    "type": ["x"],
                    "sourceTimestamp": ("none", None),
                    "payload": ("value", ("json", "{x")),
                }
            ],
        )
        for data in (bad_json, b"\x81\x81\x85ab", b"\xff"):
            res = await peer.request(common.MSG_REGISTER_REQ, data, raw=True)
            assert common.decode(common.MSG_REGISTER_RES, res) == ("failure", None)
        good = common.encode(
            common.MSG_REGISTER_REQ,
            [
                {
                    "type": ["x"],
                    "sourceTimestamp": ("none", None),
                    "payload": ("value", ("json", '{"x": [1, 2.5]}')),
                }
            ],
        )
        res = await peer.request(common.MSG_REGISTER_REQ, good, raw=True)
        kind, events = common.decode(common.MSG_REGISTER_RES, res)
        assert kind == "events" and events[0]["id"]["session"] == 1  # no session was used up
        assert (await server.query(QueryServerParams(1))).events[0].payload == EventPayloadJson(
            {"x": [1, 2.5]}
        )
        await peer.close()


async def test_a_client_that_stops_reading_is_closed_not_buffered(tmp_path: Path) -> None:
    repo = schemas.repository()
    backlog = 2 * 1024 * 1024
    async with running_server(tmp_path, max_client_backlog=backlog) as server:
        slow = await ChatterSocket.connect("127.0.0.1", port_of(server), Dialect.CURRENT)
        init = {
            "clientName": "slow",
            "clientToken": ("none", None),
            "subscriptions": [["*"]],
            "serverId": ("none", None),
            "persisted": False,
        }
        slow.conn.send(
            "HatEventer.MsgInitReq", repo.encode("HatEventer.MsgInitReq", init), last=False
        )
        slow.flush()
        reply = await slow.receive()
        assert reply.type == "HatEventer.MsgInitRes"
        await wait_until(lambda: any(c.name == "slow" for c in server.clients))
        # from now on the slow client reads nothing; another client registers 64 KiB events
        async with await eventer.connect(url_of(server), "writer") as writer:
            big = "x" * 65536
            for i in range(200):  # ~13 MiB of notifications for the slow client
                await writer.register([json_event(("big", str(i)), big)], with_response=True)
                if not any(c.name == "slow" for c in server.clients):
                    break
            await wait_until(lambda: all(c.name != "slow" for c in server.clients))
            # the server and its other clients are fine
            result = await writer.query(eventer.QueryLatestParams([("big", "0")]))
            assert len(result.events) == 1
        await slow.close()


async def test_queries_past_max_concurrent_wait_instead_of_a_retry(tmp_path: Path) -> None:
    """Hat clients cannot decode PeerwireRpc.Retry: past 1,024 requests in progress on a
    connection the server stops reading from it instead of answering with one."""
    async with running_server(tmp_path) as server:
        peer = await rpc.connect(
            url_of(server),
            registry=rpc.Registry(),
            sbs_repo=common.peer_repository(),
            reconnect=False,
            options=rpc.Options(retries=0),  # a retry result would raise RetryLater
        )
        await peer.request(common.MSG_INIT_REQ, init_bytes(), raw=True)
        [server_peer] = [p for s in server.servers for p in s.peers]
        assert not server_peer.adapter.retry_results
        query = common.encode(
            common.MSG_QUERY_REQ, common.query_params_to_sbs(QueryLatestParams([("a", "*")]))
        )
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, server_peer.handlers_running)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        try:
            # 1,300 queries in one process: on a loaded machine (CI's two xdist workers, or
            # three) they outlasted the 5-s default timeout, though none was lost
            calls = (
                peer.request(common.MSG_QUERY_REQ, query, raw=True, timeout=30) for _ in range(1300)
            )
            replies = await asyncio.gather(*calls)
        finally:
            watcher.cancel()
        assert len(replies) == 1300
        assert 0 < most <= 1024
        await peer.close()

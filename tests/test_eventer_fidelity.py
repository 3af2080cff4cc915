"""Issue 12: the last differences from hat-event 0.9.44, each checked against the real
client and server (and hat-drivers for the CLI): results over 16 MiB, registrations over
16 MiB, the dialect of Eventer URLs, JSON that only Python's json accepts, source
timestamps beyond int64 microseconds, and the init status given to ``status_cb``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net
from hat.event import common as hat
from hat.event import eventer as hat_eventer

import rpc
from rpc import eventer
from rpc.eventer import common
from tests.peers.eventer_hat_server import hat_full_server
from tests.peers.eventer_helpers import free_port, port_of, running_server, url_of, wait_until

pytestmark = [pytest.mark.interop, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
PAYLOAD = 8 * 1024
COUNT = 3000  # 3,000 events of 8 KiB: about 24 MiB, more than one 16 MiB message


def addr(port: int) -> net.TcpAddress:
    return net.TcpAddress("127.0.0.1", port)


def big_event(i: int) -> eventer.RegisterEvent:
    return eventer.RegisterEvent(
        ("big", str(i)), None, eventer.EventPayloadBinary("b", bytes([i % 256]) * PAYLOAD)
    )


def hat_big_event(i: int) -> hat.RegisterEvent:
    return hat.RegisterEvent(
        ("big", str(i)), None, hat.EventPayloadBinary("b", bytes([i % 256]) * PAYLOAD)
    )


def batches(make, count: int = COUNT, size: int = 500) -> list[list]:
    return [[make(i) for i in range(s, min(s + size, count))] for s in range(0, count, size)]


async def pages(query, params) -> list[list]:
    """Every page of a paginated query (last_event_id = the previous page's last id)."""
    out = []
    while True:
        result = await query(params)
        out.append(list(result.events))
        if not result.more_follows:
            return out
        assert result.events, "more_follows with an empty page"
        params = params._replace(last_event_id=result.events[-1].id)


# --- 1. results over max_size ---------------------------------------------------------------


async def test_hat_client_gets_large_results_from_our_server_in_pages(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        client = await hat_eventer.connect(addr(port_of(server)), "hat/big")
        for batch in batches(hat_big_event):
            assert await client.register(batch, with_response=True)

        series = await pages(
            client.query,
            hat.QueryTimeseriesParams([("big", "*")], order=hat.Order.ASCENDING),
        )
        assert len(series) > 1 and all(len(p) * PAYLOAD < 16 * MIB for p in series)
        assert [e.type for page in series for e in page] == [("big", str(i)) for i in range(COUNT)]
        own = await pages(client.query, hat.QueryServerParams(1, max_results=COUNT + 10))
        assert len(own) > 1
        assert [e.type for p in own for e in p if e.type[0] == "big"] == [
            ("big", str(i)) for i in range(COUNT)
        ]

        # a latest result cannot be cut: an error reply, never silence (hat's client cannot
        # read it and closes, which fails its query)
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(client.query(hat.QueryLatestParams([("big", "*")])), 20)
        await client.async_close()

        async with await eventer.connect(url_of(server), "pw/big") as ours:
            with pytest.raises(eventer.QueryError, match="latest result holds more than"):
                await ours.query(eventer.QueryLatestParams([("big", "*")]))
            few = await ours.query(eventer.QueryLatestParams([("big", "1"), ("big", "2")]))
            assert [e.type for e in few.events] == [("big", "1"), ("big", "2")]


async def test_our_client_reads_large_results_of_hat_server(tmp_path: Path) -> None:
    async with hat_full_server(tmp_path / "hat.lmdb") as url:
        client = await eventer.connect(url, "pw/big", max_size=64 * MIB, timeout=60)
        for batch in batches(big_event):
            assert await client.register(batch, with_response=True)
        latest = await client.query(eventer.QueryLatestParams([("big", "*")]))
        assert len(latest.events) == COUNT
        series = await client.query(
            eventer.QueryTimeseriesParams([("big", "*")], order=eventer.Order.ASCENDING)
        )
        assert [e.type for e in series.events] == [("big", str(i)) for i in range(COUNT)]
        await client.close()

        small = await eventer.connect(url, "pw/small", timeout=20)  # max_size 16 MiB
        with pytest.raises(rpc.ConnectionClosed):
            await small.query(eventer.QueryLatestParams([("big", "*")]))
        await small.close()


# --- 2. registrations over max_size ---------------------------------------------------------

HUGE = [eventer.RegisterEvent(("huge",), None, eventer.EventPayloadBinary("h", b"h" * 17 * MIB))]
HAT_HUGE = [hat.RegisterEvent(("huge",), None, hat.EventPayloadBinary("h", b"h" * 17 * MIB))]


async def test_too_large_registration_fails_alone_in_our_client(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        async with await eventer.connect(url_of(server), "pw/huge") as client:
            in_flight = asyncio.ensure_future(client.query(eventer.QueryServerParams(1)))
            with pytest.raises(eventer.RegistrationTooLarge, match="max_size 16777216"):
                await client.register(HUGE, with_response=True)
            with pytest.raises(eventer.RegistrationTooLarge):
                await client.register(HUGE)
            assert (await in_flight).events
            assert client.is_connected
            assert await client.register([big_event(1)], with_response=True)


async def test_large_registrations_with_a_raised_limit(tmp_path: Path) -> None:
    """hat-event has no limit; with ``max_message_size`` / ``max_size`` raised both of our
    sides register 17 MiB as it does."""
    async with hat_full_server(tmp_path / "hat.lmdb") as url:
        async with await eventer.connect(url, "pw/huge", max_size=64 * MIB, timeout=60) as client:
            events = await client.register(HUGE, with_response=True)
            assert events is not None and events[0].payload == HUGE[0].payload
    async with running_server(tmp_path, max_message_size=64 * MIB) as server:
        client = await hat_eventer.connect(addr(port_of(server)), "hat/huge")
        events = await client.register(HAT_HUGE, with_response=True)
        assert events is not None and events[0].payload == HAT_HUGE[0].payload
        await client.async_close()


async def test_registration_whose_events_do_not_fit_fails_alone(tmp_path: Path) -> None:
    """The request fits in max_message_size, the events (ids and timestamps added) would
    not: hat's client gets a failure response and keeps its connection."""
    limit = 1 * MIB
    async with running_server(tmp_path, max_message_size=limit) as server:
        client = await hat_eventer.connect(addr(port_of(server)), "hat/edge")
        # ~1,000 events of ~1 KiB: the request is below the limit by less than they grow
        events = [
            hat.RegisterEvent(("e", str(i)), None, hat.EventPayloadBinary("b", b"x" * 1034))
            for i in range(1000)
        ]
        size = len(
            hat.sbs_repo.encode(
                "HatEventer.MsgRegisterReq", [hat.register_event_to_sbs(e) for e in events]
            )
        )
        assert limit - 2000 < size < limit - common.ENVELOPE_RESERVE  # grows by ~12,000
        assert await client.register(events, with_response=True) is None
        assert client.is_open
        assert await client.register(events[:10], with_response=True)

        with pytest.raises(ConnectionError):  # over the frame limit: the protocol cannot
            await client.register(  # skip it, so the connection closes (documented)
                [hat.RegisterEvent(("x",), None, hat.EventPayloadBinary("b", b"x" * limit))],
                with_response=True,
            )
        await client.async_close()


# --- 5. dialect of Eventer URLs ---------------------------------------------------------------


async def test_eventer_urls_use_the_current_dialect() -> None:
    port = free_port()
    server = await hat_eventer.listen(addr(port), status=hat.Status.OPERATIONAL)
    try:
        async with await eventer.connect(f"tcp+sbs://127.0.0.1:{port}", "pw/plain") as client:
            assert client.status is eventer.Status.OPERATIONAL
            assert client.url.endswith("?dialect=HatChatter")
        with pytest.raises(ValueError, match="only in the current Chatter dialect"):
            await eventer.connect(f"tcp+sbs://127.0.0.1:{port}?dialect=Hat", "pw/legacy")
        with pytest.raises(ValueError, match="runs over Chatter"):
            await eventer.connect(f"tcp+gotalk://127.0.0.1:{port}", "pw/gotalk")
    finally:
        await server.async_close()


async def test_cli_call_to_a_current_dialect_peer_hints_at_the_dialect() -> None:
    async def on_conn(conn: hat_chatter.Connection) -> None:
        while True:
            msg = await conn.receive()
            await conn.send(hat_chatter.Data("Reply", msg.data.data), conv=msg.conv)

    srv = await hat_chatter.listen(on_conn, net.TcpAddress("127.0.0.1", 0))
    port = srv.info.addresses[0].port
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rpc.cli",
            "call",
            f"tcp+sbs://127.0.0.1:{port}",
            "op",
            "--timeout",
            "5",
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        await srv.async_close()
    assert proc.returncode != 0
    assert f"try tcp+sbs://127.0.0.1:{port}?dialect=HatChatter" in err.decode(), err


# --- 6. JSON the reference accepts --------------------------------------------------------------

SURROGATE = "\ud800x"  # JSON text "\ud800x": Python's json takes it, msgspec does not


async def test_lone_surrogate_json_round_trips(tmp_path: Path) -> None:
    async with running_server(tmp_path) as server:
        seen: asyncio.Queue = asyncio.Queue()
        client = await hat_eventer.connect(
            addr(port_of(server)),
            "hat/json",
            subscriptions=[("j",)],
            events_cb=lambda _c, evs: seen.put_nowait(list(evs)),
        )
        payload = hat.EventPayloadJson({"s": SURROGATE})
        events = await client.register([hat.RegisterEvent(("j",), None, payload)], True)
        assert events is not None and events[0].payload == payload
        assert (await asyncio.wait_for(seen.get(), 5))[0].payload == payload
        latest = await client.query(hat.QueryLatestParams([("j",)]))
        assert latest.events[0].payload == payload
        await client.async_close()
        mine = eventer.EventPayloadJson({"s": SURROGATE})
        async with await eventer.connect(url_of(server), "pw/json") as ours:
            result = await ours.query(eventer.QueryLatestParams([("j",)]))
            assert result.events[0].payload == mine
            registered = await ours.register([eventer.RegisterEvent(("j",), None, mine)], True)
            assert registered is not None and registered[0].payload == mine
    async with hat_full_server(tmp_path / "hat.lmdb") as url:
        async with await eventer.connect(url, "pw/json") as ours:
            registered = await ours.register([eventer.RegisterEvent(("j",), None, mine)], True)
            assert registered is not None and registered[0].payload == mine


# --- 7. source timestamps beyond int64 microseconds ---------------------------------------------

STAMPS = [
    (2**62, 5),
    (2**62, 3),
    (-(2**62), 0),
    (2**62 + 1, 0),
    (0, 0),
    (-(2**62) - 1, 999_999),
    (9_300_000_000_000, 1),
    (-9_300_000_000_000, 1),
]


async def test_huge_source_timestamps_order_as_in_hat(tmp_path: Path) -> None:
    register = [
        eventer.RegisterEvent(("ts", str(i)), eventer.Timestamp(*t), eventer.EventPayloadJson(i))
        for i, t in enumerate(STAMPS)
    ]
    queries = [
        eventer.QueryTimeseriesParams(order=order, order_by=eventer.OrderBy.SOURCE_TIMESTAMP)
        for order in eventer.Order
    ] + [
        eventer.QueryTimeseriesParams(
            [("ts", "*")],
            source_t_from=eventer.Timestamp(2**62, 4),
            source_t_to=eventer.Timestamp(2**62 + 1, 0),
            order=eventer.Order.ASCENDING,
            order_by=eventer.OrderBy.SOURCE_TIMESTAMP,
        ),
        eventer.QueryTimeseriesParams(
            [("ts", "*")],
            source_t_to=eventer.Timestamp(-(2**62), 0),
            order_by=eventer.OrderBy.SOURCE_TIMESTAMP,
        ),
    ]
    answers: dict[str, list] = {}
    async with running_server(tmp_path) as server, hat_full_server(tmp_path / "h.lmdb") as url:
        for name, target in (("ours", url_of(server)), ("hat", url)):
            async with await eventer.connect(target, "pw/ts") as client:
                assert await client.register(register, with_response=True)
                answers[name] = [
                    [e.payload.data for e in (await client.query(q)).events if e.type[0] == "ts"]
                    for q in queries
                ]
    expected = sorted(range(len(STAMPS)), key=lambda i: STAMPS[i])
    assert answers["ours"][1] == expected
    assert answers["ours"] == answers["hat"]


# --- 8. status_cb and the init status -------------------------------------------------------------


async def test_status_cb_gets_the_init_status_unlike_hat(tmp_path: Path) -> None:
    """A documented difference: our client reports the init status to status_cb, hat's
    only later changes; both then see the same changes."""
    async with running_server(tmp_path) as server:
        ours: list[eventer.Status] = []
        theirs: list[hat.Status] = []
        client = await eventer.connect(
            url_of(server), "pw/s", status_cb=lambda _c, s: ours.append(s)
        )
        hat_client = await hat_eventer.connect(
            addr(port_of(server)), "hat/s", status_cb=lambda _c, s: theirs.append(s)
        )
        await server.set_status(eventer.Status.STANDBY)
        await wait_until(lambda: len(ours) == 2 and len(theirs) == 1)
        assert ours == [eventer.Status.OPERATIONAL, eventer.Status.STANDBY]
        assert theirs == [hat.Status.STANDBY]
        await client.close()
        await hat_client.async_close()

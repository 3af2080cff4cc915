"""A randomized end-to-end test of a connection's input flow (rpc.peer, rpc.input_flow,
rpc.backlog, rpc.responder): a server without retry results and with small limits
(``max_concurrent``, ``max_stream_queue``, ``high_water``, ``max_request_bytes``) and a
client that sends a drawn interleaving of stream requests (whose parts pause at drawn
points, so other calls come between them), plain requests, requests that take a handler
slot, calls the server answers by calling the client back, handlers held until the test
releases them, big results that fill the server's output, streamed results the client
reads with pauses (its own reading then pauses), notifications and cancellations.

What must hold whatever the interleaving: every call not cancelled completes within 10 s
with its value; each stream handler saw its parts once, in order (a cancelled one: a
prefix); notifications ran once, in order; the connection stays open; afterwards the
server's backlog is empty and no handler runs.

The client's whole output in an example is kept well within a quarter of
``max_request_bytes`` (the backlog's own share): the backlog never fills, so no call waits
on input that a full backlog left unread (docs/limits.md: "Pending output past the
backlog's bound ... can still fill it, and calls then waiting end at their timeouts"; a
stall there is the documented limit, not a defect of this test's concern). The driver
never waits on the server; what pauses (a stream's parts, a reader of streamed results)
waits for loop turns, a few milliseconds or the driver's progress, never for the server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rpc
from tests.rpc_helpers import FLAVOURS, wait_until

pytestmark = pytest.mark.timeout(120)

KIB = 1024
BOUND = 10.0
"""Seconds every call not cancelled has to complete in once the driver is done."""

# --- what the client does -------------------------------------------------------------------

short_pauses = st.one_of(
    st.tuples(st.just("turns"), st.integers(1, 5)),
    st.tuples(st.just("ms"), st.sampled_from([1, 3, 10, 30])),
)
pauses = st.one_of(
    short_pauses,
    st.tuples(st.just("op"), st.integers(1, 6)),  # until the driver sent that many ops more
)


def paused_at(count: int) -> st.SearchStrategy[dict[int, tuple[str, int]]]:
    return st.dictionaries(st.integers(0, max(0, count - 1)), pauses, max_size=3)


@st.composite
def stream_op(draw: st.DrawFn) -> tuple[Any, ...]:
    count = draw(st.integers(1, 12))
    return ("stream", count, draw(st.sampled_from([0, 10, 300])), draw(paused_at(count)))


@st.composite
def short_op(draw: st.DrawFn) -> tuple[Any, ...]:
    """A stream whose handler answers after ``take`` parts (the rest are dropped)."""
    count = draw(st.integers(1, 12))
    take = draw(st.integers(1, count))
    return ("short", count, take, draw(st.sampled_from([0, 300])), draw(paused_at(count)))


@st.composite
def twoway_op(draw: st.DrawFn) -> tuple[Any, ...]:
    """A stream whose handler answers each part as it comes (a streamed result)."""
    count = draw(st.integers(1, 12))
    return ("twoway", count, draw(st.sampled_from([0, 300])), draw(paused_at(count)))


@st.composite
def results_op(draw: st.DrawFn) -> tuple[Any, ...]:
    count = draw(st.integers(1, 12))
    return ("results", count, draw(st.sampled_from([10, 2000])), draw(paused_at(count)))


ops = st.one_of(
    stream_op(),
    short_op(),
    twoway_op(),
    results_op(),
    st.tuples(st.just("echo"), st.integers(0, 200)),
    st.tuples(st.just("aecho"), st.sampled_from([0, 100, 5000, 9000])),  # > 4 KiB: counted
    st.tuples(st.just("callback"), st.integers(0, 200)),
    st.tuples(st.just("slow")),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("big"), st.sampled_from([20 * KIB, 100 * KIB, 300 * KIB])),
    st.tuples(st.just("notify")),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("pause"), short_pauses),  # (the driver waits for itself: never "op")
)


@dataclass
class Limits:
    max_concurrent: int
    max_stream_queue: int
    high_water: int
    client_stream_queue: int
    slack: int


limits = st.builds(
    Limits,
    max_concurrent=st.integers(1, 3),
    max_stream_queue=st.integers(1, 8),
    high_water=st.sampled_from([4 * KIB, 16 * KIB, 64 * KIB]),
    client_stream_queue=st.integers(1, 8),
    slack=st.sampled_from([0, 64 * KIB]),
)


def part(sid: int, index: int, pad: int) -> list[Any]:
    return [sid, index, "p" * pad]


def counted_bound(plan: list[tuple[Any, ...]]) -> int:
    """More than the server's backlog counts for every message the client may send in
    ``plan`` (each message: twice its JSON payload, plus 512 for its names and the
    backlog's 256 of overhead), heartbeats and cancellations included."""
    total = 64 * 512  # heartbeats, the first echoes, the last ones

    def message(value: Any) -> int:
        return 512 + 2 * len(json.dumps(value))

    for op in plan:
        kind = op[0]
        if kind in ("stream", "short", "twoway"):
            pad = op[-2]
            total += sum(message(part(10**6, i, pad)) for i in range(op[1])) + message(None)
        elif kind == "aecho":
            total += message("a" * op[1])
        elif kind in ("echo", "callback"):
            total += message("e" * op[1])
        elif kind in ("slow", "big", "notify", "results", "cancel"):
            total += message(10**6)
    return total


@dataclass
class Server:
    """The server's handlers and what they saw."""

    gates: defaultdict[int, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event)
    )
    parts: defaultdict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    notes: list[int] = field(default_factory=list)
    registry: rpc.Registry = field(default_factory=rpc.Registry)

    def __post_init__(self) -> None:
        reg = self.registry

        @reg.handle_stream("collect")
        async def collect(parts: AsyncIterator[Any]) -> list[int]:
            got = []
            async for sid, index, _pad in parts:
                self.parts[sid].append(index)
                got.append(index)
                if index % 3 == 2:
                    await asyncio.sleep(0)  # a reader a little behind now and then
            return got

        @reg.handle_stream("short")
        async def short(parts: AsyncIterator[Any]) -> list[int]:
            got = []
            async for sid, index, take in parts:
                self.parts[sid].append(index)
                got.append(index)
                if len(got) == take:
                    break
            return got

        @reg.handle_stream("twoway")
        async def twoway(parts: AsyncIterator[Any]) -> AsyncIterator[int]:
            async for sid, index, _pad in parts:
                self.parts[sid].append(index)
                yield index

        @reg.handle("echo")
        def echo(value: Any) -> Any:
            return value

        @reg.handle("aecho")
        async def aecho(value: Any) -> Any:
            await asyncio.sleep(0)
            return value

        @reg.handle("callback")
        async def callback(value: Any) -> Any:
            return ["back", await rpc.current_peer.get().request("client_echo", value)]

        @reg.handle("slow")
        async def slow(gate: int) -> int:
            await self.gates[gate].wait()
            return gate

        @reg.handle("big")
        def big(size: int) -> str:
            return "b" * size

        @reg.handle("count")
        async def count(spec: list[int]) -> AsyncIterator[list[Any]]:
            total, pad = spec
            for index in range(total):
                yield [index, "r" * pad]

        @reg.handle_notification("note")
        async def note(value: int) -> None:
            self.notes.append(value)  # in the order they are dispatched
            await asyncio.sleep(0)


async def pause(spec: tuple[str, int], sent: list[int], events: dict[int, asyncio.Event]) -> None:
    kind, amount = spec
    if kind == "turns":
        for _ in range(amount):
            await asyncio.sleep(0)
    elif kind == "ms":
        await asyncio.sleep(amount / 1000)  # (a pause of the client's, not a synchronisation)
    else:  # until the driver sent ``amount`` ops more than it had when this began
        target = sent[0] + amount
        if target in events:
            await events[target].wait()


async def with_take(source: AsyncIterator[list[Any]], take: int) -> AsyncIterator[list[Any]]:
    """Parts whose third field tells the handler when to answer."""
    async for sid, index, _pad in source:
        yield [sid, index, take]


def small_buffers(sock: Any, option: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, option, 64 * KIB)


def client_registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("client_echo")
    def client_echo(value: Any) -> Any:
        return value

    return reg


def describe(peer: Any) -> str:
    kept = peer._kept
    return (
        f"kept={len(kept)} front={kept.front is not None} sorted={kept.sorted} "
        f"refused={kept.refused!r:.80} turn={kept.turn is not None} reading={peer.reading} "
        f"running={peer.handlers_running} blocked={peer.outbox.blocked} "
        f"stream_hold={peer._stream_hold.active} used={peer._request_bytes.used} "
        f"reserved={peer._request_bytes.reserved} streams={len(peer._streams)} "
        f"open={peer.is_open} violation={peer.violation!r}"
    )


async def run_plan(flavour: str, lim: Limits, plan: list[tuple[Any, ...]]) -> None:
    if flavour != "gotalk":  # Chatter: results wait for the caller's End (rpc.token_waits),
        plan = [  # at most max_stream_queue of them (more: an error result, documented)
            (kind, min(op[1], lim.max_stream_queue), *op[2:])
            if kind == "twoway"
            else ("twoway", *op[1:])  # (the reproduction below: not capped)
            if kind == "twoway_uncapped"
            else op
            for op in plan
            for kind in [op[0]]
        ]
    server = Server()
    bound = counted_bound(plan)
    options = rpc.Options(
        timeout=30,
        max_concurrent=lim.max_concurrent,
        max_stream_queue=lim.max_stream_queue,
        high_water=lim.high_water,
        low_water=lim.high_water // 4,
        max_request_bytes=4 * bound + lim.slack,  # the backlog's share holds it all
    )
    scheme, query = FLAVOURS[flavour]
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=server.registry, options=options, retry_results=False
    ) as srv:
        url = f"{scheme}://127.0.0.1:{srv.url.port}{query}"
        client_options = rpc.Options(timeout=30, max_stream_queue=lim.client_stream_queue)
        async with rpc.connect(
            url, registry=client_registry(), options=client_options, reconnect=False
        ) as client:
            await wait_until(lambda: len(srv.peers) == 1)
            [peer] = srv.peers
            small_buffers(peer.transport.get_extra_info("socket"), socket.SO_SNDBUF)
            small_buffers(client.transport.get_extra_info("socket"), socket.SO_RCVBUF)
            assert await client.request("echo", "hello") == "hello"  # extensions agreed
            await drive(client, server, peer, plan)
            assert client.is_open and peer.is_open and srv.peers == {peer}
            assert await client.request("echo", "bye") == "bye"
            await wait_until(lambda: peer.handlers_running == 0 and not len(peer._kept), BOUND)
            assert peer.violation is None


async def drive(client: rpc.Peer, server: Server, peer: Any, plan: list[tuple[Any, ...]]) -> None:
    sent = [0]  # ops the driver has sent so far
    events: dict[int, asyncio.Event] = {n: asyncio.Event() for n in range(len(plan) + 8)}
    calls: list[tuple[asyncio.Task[Any], Any]] = []  # (task, expected value)
    streams: dict[int, int] = {}  # stream id -> parts
    stream_tasks: dict[int, asyncio.Task[Any]] = {}
    slows: list[int] = []
    notes: list[int] = []
    cancelled: set[asyncio.Task[Any]] = set()

    async def parts(sid: int, count: int, pad: int, at: dict[int, tuple[str, int]]) -> Any:
        for index in range(count):
            if index in at:
                await pause(at[index], sent, events)
            yield part(sid, index, pad)

    async def streamed(sid: int, count: int, pad: int, at: dict[int, tuple[str, int]]) -> Any:
        return [r async for r in client.stream("collect", parts=parts(sid, count, pad, at))]

    async def short(sid: int, count: int, take: int, pad: int, at: Any) -> Any:
        source = parts(sid, count, pad, at)
        return [r async for r in client.stream("short", parts=with_take(source, take))]

    async def twoway(sid: int, count: int, pad: int, at: Any) -> Any:
        return [r async for r in client.stream("twoway", parts=parts(sid, count, pad, at))]

    async def results(count: int, pad: int, at: dict[int, tuple[str, int]]) -> list[int]:
        got = []
        async for index, _pad in client.stream("count", value=[count, pad]):
            if index in at:
                await pause(at[index], sent, events)
            got.append(index)
        return got

    for serial, op in enumerate(plan, start=1):
        kind = op[0]
        if kind == "stream":
            _, count, pad, at = op
            task = asyncio.ensure_future(streamed(serial, count, pad, at))
            streams[serial] = count
            stream_tasks[serial] = task
            calls.append((task, [list(range(count))]))
        elif kind == "short":
            _, count, take, pad, at = op
            task = asyncio.ensure_future(short(serial, count, take, pad, at))
            streams[serial] = take
            stream_tasks[serial] = task
            calls.append((task, [list(range(take))]))
        elif kind == "twoway":
            _, count, pad, at = op
            task = asyncio.ensure_future(twoway(serial, count, pad, at))
            streams[serial] = count
            stream_tasks[serial] = task
            calls.append((task, list(range(count))))
        elif kind == "results":
            _, count, pad, at = op
            calls.append((asyncio.ensure_future(results(count, pad, at)), list(range(count))))
        elif kind == "echo":
            value = f"{serial}:" + "e" * op[1]
            calls.append((asyncio.ensure_future(client.request("echo", value)), value))
        elif kind == "aecho":
            value = f"{serial}:" + "a" * op[1]
            calls.append((asyncio.ensure_future(client.request("aecho", value)), value))
        elif kind == "callback":
            value = f"{serial}:" + "c" * op[1]
            task = asyncio.ensure_future(client.request("callback", value))
            calls.append((task, ["back", value]))
        elif kind == "slow":
            slows.append(serial)
            calls.append((asyncio.ensure_future(client.request("slow", serial)), serial))
        elif kind == "release" and slows:
            server.gates[slows[op[1] % len(slows)]].set()
        elif kind == "big":
            calls.append((asyncio.ensure_future(client.request("big", op[1])), "b" * op[1]))
        elif kind == "notify":
            client.notify("note", serial)
            notes.append(serial)
        elif kind == "cancel" and (pending := [t for t, _ in calls if not t.done()]):
            task = pending[op[1] % len(pending)]
            task.cancel()
            cancelled.add(task)
        elif kind == "pause":
            await pause(op[1], sent, events)
        sent[0] += 1
        events[sent[0]].set()
        await asyncio.sleep(0)  # the calls started get to send
    for event in events.values():
        event.set()
    for gate in slows:
        server.gates[gate].set()

    tasks = [task for task, _ in calls]
    try:
        async with asyncio.timeout(BOUND):
            if tasks:
                await asyncio.wait(tasks)
    except TimeoutError:
        pending = [i for i, task in enumerate(tasks) if not task.done()]
        raise AssertionError(
            f"{len(pending)} calls hung: {[str(calls[i][1])[:40] for i in pending]}; "
            f"server: {describe(peer)}; client: {describe(client)}"
        ) from None
    for task, expected in calls:
        if task in cancelled and task.cancelled():
            continue
        assert task.result() == expected, (task.result(), expected)
    for sid, count in streams.items():
        seen = server.parts.get(sid, [])
        if stream_tasks[sid].cancelled():
            assert seen == list(range(len(seen))), (sid, seen)  # a prefix, in order
        else:
            assert seen == list(range(count)), (sid, seen)
    await wait_until(lambda: len(server.notes) >= len(notes), BOUND)
    assert server.notes == notes


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(lim=limits, plan=st.lists(ops, min_size=1, max_size=25))
async def test_random_input_flow_completes_in_order(
    flavour: str, lim: Limits, plan: list[tuple[Any, ...]]
) -> None:
    await run_plan(flavour, lim, plan)

"""The caller's deadline bounds a served call even where its handler never waits.

A streamed result whose generator never awaits gives the loop a turn only every
``PARTS_PER_TURN`` (256) parts, and between two parts its task is outside its bound: the
bound's timer found nothing to cancel, and the stream ran for as long as its generator
did. Now the next part after the timer fired fails. A call whose bound has passed by the
time its handler would start (it waited behind a handler that held the loop) is answered
with the bound's error, its handler never run; before, a handler that did not wait ran
and its result went out. A raw Gotalk client: it never cancels, so the bound alone ends
the call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc import gotalk_peer
from rpc.intercept import DEADLINE_GRACE
from rpc.streaming import PARTS_PER_TURN
from tests.gotalk_raw import RawGotalk, served_raw
from wire import gotalk, metadata

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_loops]

DEADLINE_MS = 300


async def passthrough(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


class Endless:
    """``endless``: a streamed result that never waits; it notes how many parts it made
    once its caller's bound (deadline plus grace) had passed, by the monotonic clock
    (the loop's: uvloop's does not move while the generator runs)."""

    def __init__(self) -> None:
        self.after_bound = 0
        self.closed = asyncio.Event()
        self.registry = reg = rpc.Registry()

        @reg.handle("endless")
        async def endless(_: Any = None) -> AsyncIterator[int]:
            call = rpc.current_call.get()
            assert call.deadline is not None
            loop = asyncio.get_running_loop()
            bound = time.monotonic() + (call.deadline + DEADLINE_GRACE - loop.time())
            count = 0
            try:
                while True:
                    count += 1
                    if time.monotonic() > bound:
                        self.after_bound += 1
                    yield count
            finally:
                self.closed.set()


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_a_stream_that_never_waits_ends_at_its_bound(middleware: bool) -> None:
    endless = Endless()
    options = rpc.Options(middleware=[passthrough] if middleware else [])
    async with served_raw(endless.registry, options) as (raw, _peer):
        loop = asyncio.get_running_loop()
        started = loop.time()
        raw.request(b"0001", "endless", b"null", DEADLINE_MS)
        parts = 0
        async with asyncio.timeout(10):  # before: parts for as long as one read them
            while True:
                message = await raw.answer()
                if not isinstance(message, gotalk.StreamResult):
                    break
                parts += 1
        assert isinstance(message, gotalk.ErrorResult), message
        assert message.payload == b"endless: the caller's deadline passed"
        assert await raw.answer() == gotalk.StreamResult(b"0001", b"")  # the stream's end
        elapsed = loop.time() - started
        assert DEADLINE_MS / 1000 <= elapsed < 5, elapsed
        await asyncio.wait_for(endless.closed.wait(), 5)  # its generator closed
        # within a turn's parts of the bound (the clocks may differ by uvloop's millisecond)
        assert parts > PARTS_PER_TURN and endless.after_bound <= 4 * PARTS_PER_TURN, (
            parts,
            endless.after_bound,
        )


def waiting_registry(ran: list[str]) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("hold")
    async def hold(_: Any = None) -> str:
        time.sleep(DEADLINE_MS / 1000 * 1.5)  # holds the loop: what is queued behind waits
        return "held"

    @reg.handle("quick")
    async def quick(name: str) -> str:
        ran.append(name)
        return name

    @reg.handle("wait")
    async def wait(_: Any = None) -> str:
        await asyncio.sleep(10)  # ended by its bound
        return "waited"

    return reg


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_a_call_past_its_bound_before_it_starts_is_not_run(middleware: bool) -> None:
    ran: list[str] = []
    options = rpc.Options(middleware=[passthrough] if middleware else [])
    async with served_raw(waiting_registry(ran), options) as (raw, _peer):
        raw.request_alone(b"0001", "hold", b"null")  # no deadline
        # bound at 100 ms + DEADLINE_GRACE: it is read with "hold", and queued behind it
        raw.request(b"0002", "quick", b'"late"', 100)
        answers = {}
        async with asyncio.timeout(10):
            while len(answers) < 2:
                message = await raw.answer()
                answers[message.id] = message
        assert answers[b"0001"] == gotalk.Result(b"0001", b'"held"')
        late = answers[b"0002"]
        assert late == gotalk.ErrorResult(b"0002", b"quick: the caller's deadline passed"), late
        assert ran == []
        raw.request(b"0003", "quick", b'"in time"', 5000)  # the connection serves on
        assert await raw.answer() == gotalk.Result(b"0003", b'"in time"')
        assert ran == ["in time"]


def request_bytes(rid: bytes, op: str, payload: bytes, timeout_ms: int | None) -> bytes:
    """A request as RawGotalk.request writes it: its metadata (if ``timeout_ms``), then it."""
    out = b""
    if timeout_ms is not None:
        meta = metadata.encode_gotalk(rid, metadata.RequestMeta(timeout_ms, {"k": "v"}))
        out += RawGotalk.notification(gotalk_peer.META, meta)
    header = gotalk.request_header(gotalk.MessageType.REQUEST, rid, op, len(payload))
    return out + header + payload


async def answers_to(raw: RawGotalk, count: int) -> dict[bytes, Any]:
    """The next ``count`` answers, by request id."""
    answers = {}
    async with asyncio.timeout(10):
        while len(answers) < count:
            message = await raw.answer()
            answers[message.id] = message
    return answers


async def test_a_call_past_a_bound_shared_with_a_waiting_call_is_not_run() -> None:
    """Three requests in one read: ``wait`` and ``quick`` with the same timeout (so the
    same bound: read time + 100 ms + DEADLINE_GRACE), ``hold`` between them, holding the
    loop past that bound. Before, CallBounds kept the last bound found ahead of the clock
    for the whole connection (``wait``'s) and took a call with that bound for ahead
    without a clock read: ``quick``, started after ``hold`` in the same loop step (the
    timer had no turn to fire), ran and its result went out."""
    ran: list[str] = []
    async with served_raw(waiting_registry(ran)) as (raw, _peer):
        raw.writer.write(  # one segment: one read, one read time
            request_bytes(b"0001", "wait", b"null", 100)
            + request_bytes(b"0002", "hold", b"null", None)
            + request_bytes(b"0003", "quick", b'"late"', 100)
        )
        answers = await answers_to(raw, 3)
        assert answers[b"0002"] == gotalk.Result(b"0002", b'"held"')
        assert answers[b"0001"] == gotalk.ErrorResult(
            b"0001", b"wait: the caller's deadline passed"
        )
        late = answers[b"0003"]
        assert late == gotalk.ErrorResult(b"0003", b"quick: the caller's deadline passed"), late
        assert ran == []


async def test_a_task_returned_past_its_bound_is_cancelled_not_left_running() -> None:
    """A plain function that returns a Task (an awaitable, not a coroutine), reached after
    its bound passed (read with ``hold``, which holds the loop past it): its caller is told
    the deadline passed, and the Task is cancelled. Before, only a coroutine was closed:
    the Task ran on unawaited, its work done though its caller was told it never ran."""
    ran: list[str] = []
    reg = waiting_registry(ran)

    async def work(name: str) -> str:
        ran.append(name)
        return name

    @reg.handle("task")
    def task(name: str) -> Any:
        return asyncio.ensure_future(work(name))

    options = rpc.Options(middleware=[passthrough])  # plain functions bounded: middleware
    async with served_raw(reg, options) as (raw, _peer):
        raw.writer.write(  # one segment: one read, one read time
            request_bytes(b"0001", "hold", b"null", None)
            + request_bytes(b"0002", "task", b'"late"', 100)
        )
        answers = await answers_to(raw, 2)
        assert answers[b"0001"] == gotalk.Result(b"0001", b'"held"')
        late = answers[b"0002"]
        assert late == gotalk.ErrorResult(b"0002", b"task: the caller's deadline passed"), late
        raw.request(b"0003", "quick", b'"after"', 5000)  # a turn of the loop or more
        assert await raw.answer() == gotalk.Result(b"0003", b'"after"')
        assert ran == ["after"], ran

"""CallBounds: served calls bounded by their callers' deadlines on the connection's timer."""

from __future__ import annotations

import asyncio

import pytest

from rpc.call_bounds import BoundPassed, CallBounds
from rpc.deadlines import Deadlines


def bounds_on_loop() -> tuple[CallBounds, Deadlines]:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    return CallBounds(deadlines, loop), deadlines


async def test_only_the_calls_past_their_bound_end_and_one_timer_serves_them_all() -> None:
    bounds, deadlines = bounds_on_loop()
    loop = asyncio.get_running_loop()
    now = loop.time()
    never = asyncio.Event()
    quick, slow = (
        asyncio.ensure_future(bounds.within(never.wait(), now + delay, "wait"))
        for delay in (0.5, 30)
    )
    # bounds far enough apart that a busy machine's late timer cannot fire for both at once
    done = asyncio.ensure_future(bounds.within(asyncio.sleep(0, "answer"), now + 0.05, "answer"))
    assert await done == "answer"  # finished first: its bound is dropped, nothing fires
    assert len(bounds) == 2 and deadlines.when("served") == pytest.approx(now + 0.05)
    with pytest.raises(BoundPassed, match=r"^wait: the caller's deadline passed$"):
        await quick
    assert not slow.done() and len(bounds) == 1
    assert deadlines.when("served") == pytest.approx(now + 30)  # re-armed for what is left
    # the bound dropped for the finished call cost one early wake-up, no more
    assert deadlines.wakeups == 2
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert len(bounds) == 0


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    """As with asyncio.timeout_at: the caller's own cancellation is not taken for the bound,
    even when both arrive together, and the task's cancel count is left right."""
    bounds, _ = bounds_on_loop()
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    async def handler() -> None:
        started.set()
        await asyncio.Event().wait()

    async def served(when: float) -> None:
        await bounds.within(handler(), when, "handler")

    task = asyncio.ensure_future(served(loop.time() + 30))
    await started.wait()
    task.cancel()  # the caller gave up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelling() == 1 and len(bounds) == 0

    started.clear()
    when = loop.time() + 0.02
    both = asyncio.ensure_future(served(when))
    await started.wait()
    loop.call_at(when, both.cancel)  # the caller's cancel, in the same turn as the bound's
    with pytest.raises(asyncio.CancelledError):
        await both
    assert both.cancelling() == 1 and len(bounds) == 0  # the bound's own was taken back


async def test_a_handler_that_swallows_the_cancel_keeps_its_result() -> None:
    bounds, _ = bounds_on_loop()
    loop = asyncio.get_running_loop()

    async def stubborn() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "kept"
        return "never"

    async def served() -> tuple[str, int]:
        result = await bounds.within(stubborn(), loop.time() + 0.01, "stubborn")
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    assert await served() == ("kept", 0)  # the bound's cancellation was taken back
    assert len(bounds) == 0


async def test_clear_forgets_every_bound() -> None:
    bounds, deadlines = bounds_on_loop()
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(bounds.within(asyncio.Event().wait(), loop.time() + 30, "wait"))
    await asyncio.sleep(0)
    assert len(bounds) == 1
    deadlines.close()
    bounds.clear()  # the connection went: its tasks are cancelled by the peer
    assert len(bounds) == 0
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

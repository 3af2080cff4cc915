"""rpc.deadlines: coarse liveness deadlines and re-arming for a slot that moved later; the
wait for a stream's next result (rpc.streaming.ResultWait)."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from rpc.deadlines import COARSE_FROM, COARSE_TICK, Deadlines
from rpc.streaming import ResultWait, StreamQueue
from wire import gotalk


def nothing() -> None:
    return None


async def test_coarse_deadlines_round_up_to_the_tick_and_near_ones_stay_exact() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    far = loop.time() + COARSE_FROM + 1.0123
    deadlines.set("far", far, nothing, coarse=True)
    rounded = deadlines.when("far")
    assert rounded is not None and far <= rounded < far + COARSE_TICK
    assert (rounded / COARSE_TICK).is_integer()
    near = loop.time() + 1.0123
    deadlines.set("near", near, nothing, coarse=True)
    assert deadlines.when("near") == near
    exact = loop.time() + COARSE_FROM + 1.0123
    deadlines.set("exact", exact, nothing)
    assert deadlines.when("exact") == exact
    deadlines.close()


async def test_rearm_moves_the_timer_later_so_it_does_not_wake_early() -> None:
    loop = asyncio.get_running_loop()
    moved, witness = Deadlines(loop), Deadlines(loop)
    fired = asyncio.Event()
    moved.set("ping", loop.time() + 0.05, nothing)
    moved.set("ping", loop.time() + 60, nothing)  # moved later: the timer is left alone
    moved.rearm()  # ... unless re-armed
    witness.set("done", loop.time() + 0.2, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert (moved.wakeups, witness.wakeups) == (0, 1)
    left_alone = Deadlines(loop)
    left_alone.set("ping", loop.time() + 0.05, nothing)
    left_alone.set("ping", loop.time() + 60, nothing)
    fired.clear()
    witness.set("done", loop.time() + 0.2, fired.set)
    await asyncio.wait_for(fired.wait(), 5)
    assert left_alone.wakeups == 1  # woke at the old time, found nothing due, re-armed
    for deadlines in (moved, witness, left_alone):
        deadlines.close()


@pytest.mark.both_loops
async def test_a_deadline_just_past_a_millisecond_wakes_its_timer_once() -> None:
    """uvloop's clock and timers move in whole milliseconds: the timer of a call whose
    deadline lies a hair past a millisecond fires on that millisecond, while the clock
    still reads before the deadline. The call times out then (:meth:`Deadlines.now`, the
    timer's own ``EARLY`` allowance) instead of re-arming for the same instant, again and
    again until the clock moves on (as a Chatter peer's Ping plan did, 188 wake-ups)."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(gotalk.GotalkConnection().handshake())  # a Gotalk server's version
        await reader.read()  # then takes every request and answers none
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    peer = await rpc.connect(f"tcp+gotalk://127.0.0.1:{port}", reconnect=False)
    try:
        for _ in range(20):
            before = peer.deadlines.wakeups
            with pytest.raises(rpc.RequestTimeout):
                await peer.request("wait", b"", timeout=0.001 + 1e-7)
            assert peer.deadlines.wakeups - before <= 2
    finally:
        await peer.close(drain_timeout=0)
        server.close()


async def test_a_slot_that_sets_itself_again_leaves_an_earlier_slot_on_time() -> None:
    """A slot due first whose callback sets it again later (a heartbeat does each beat)
    armed the timer for its own next time: a slot due in between waited for that one.
    Before, "between" (due at +0.2 s) fired at +1.0 s with "beat"."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    start = loop.time()
    between = asyncio.Event()

    def beat() -> None:
        deadlines.set("beat", start + 1.0, nothing)

    deadlines.set("beat", start + 0.05, beat)
    deadlines.set("between", start + 0.2, between.set)
    await asyncio.wait_for(between.wait(), 0.8)  # at +1.0 before: TimeoutError
    assert loop.time() - start < 0.8
    deadlines.close()


async def test_a_stream_result_already_queued_is_taken_without_a_wait() -> None:
    """Results that came in one read are queued before the caller asks: they are taken at
    once, even with no time left to wait for one; an empty queue still times out, and the
    whole stream's deadline still holds with results queued."""
    loop = asyncio.get_running_loop()
    queue = StreamQueue(loop, 30.0)
    for n in (1, 2):
        queue.put(n)
    wait = ResultWait(loop, "op", None, 0.0)
    assert [await wait.next(queue), await wait.next(queue)] == [1, 2]
    with pytest.raises(rpc.RequestTimeout, match=r"op: no result within 0\.0 s"):
        await wait.next(queue)
    loop.call_soon(queue.put, 4)  # a result that comes while the caller waits
    assert await ResultWait(loop, "op", None, 10.0).next(queue) == 4
    reader = asyncio.create_task(ResultWait(loop, "op", None, 10.0).next(queue))
    await asyncio.sleep(0)  # the reader waits
    reader.cancel()  # a reader that gives up leaves no waiter behind
    with pytest.raises(asyncio.CancelledError):
        await reader
    queue.put(5)
    assert await ResultWait(loop, "op", None, 10.0).next(queue) == 5


async def test_a_bounded_await_past_the_deadline_is_overdue_and_its_own_timeout_is_not() -> None:
    """A stream's deadline turns the wait it ends into the stream's RequestTimeout; a
    TimeoutError of the awaited source's own goes through as it is."""
    loop = asyncio.get_running_loop()

    async def own_timeout() -> None:
        raise TimeoutError("the source's own")

    wait = ResultWait(loop, "op", 10.0, 10.0)
    with pytest.raises(TimeoutError, match="the source's own") as raised:
        await wait.bounded(own_timeout())
    assert raised.type is TimeoutError
    short = ResultWait(loop, "op", 0.01, 10.0)
    with pytest.raises(rpc.RequestTimeout, match=r"op: stream not done within 0\.01 s"):
        await short.bounded(asyncio.Event().wait())

"""rpc.handler_runner.HandlerRunner: request handlers run by a few worker tasks.

Jobs that finish without waiting run one after another in one worker; one that waits
keeps its worker (task semantics: current_task, asyncio.timeout, TaskGroup, cancellation)
while the queue goes on in another; each runs in its own context; a cancelled job alone
ends; closing cancels the waiting and closes the queued unrun. On both loops."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import logging
import warnings
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

import rpc
from rpc.handler_runner import HandlerRunner
from tests.rpc_helpers import served

pytestmark = pytest.mark.both_loops

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("runner_test_mark", default="unset")


@contextlib.contextmanager
def no_coroutine_left_unawaited() -> Iterator[None]:
    """Fails if a coroutine made inside is collected unawaited ("coroutine ... was never
    awaited"; the garbage is collected on the way out). Other warnings raised meanwhile are
    recorded and left alone: an earlier test's unclosed socket collected here is not this
    test's failure."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert [str(w.message) for w in caught if "was never awaited" in str(w.message)] == []


class Owner:
    """A runner's owner as the peer is one: each job it submits awaits a handler's
    coroutine and records the result (or the exception) by key."""

    def __init__(self) -> None:
        self.results: dict[int, Any] = {}
        self.done = 0
        self.runner: HandlerRunner[int] = HandlerRunner(asyncio.get_running_loop(), self.on_done)

    def submit(self, key: int, handler: Coroutine[Any, Any, Any]) -> None:
        self.runner.submit(key, self.serve(key, handler), handler)

    async def serve(self, key: int, handler: Coroutine[Any, Any, Any]) -> None:
        try:
            self.results[key] = await handler
        except asyncio.CancelledError:
            self.results[key] = "cancelled"
            raise
        except Exception as exc:
            self.results[key] = exc

    def on_done(self) -> None:
        self.done += 1

    async def settled(self) -> None:
        """Until no job is queued or running (a few loop turns at most here)."""
        async with asyncio.timeout(5):
            while self.runner.jobs:
                await asyncio.sleep(0)


def assert_clean(runner: HandlerRunner[int]) -> None:
    """Nothing of a finished job is left behind."""
    assert runner.jobs == 0
    assert not runner._queue and not runner._waiting_jobs and not runner._cancelled


async def test_handlers_that_do_not_wait_share_one_worker_in_order() -> None:
    owner = Owner()
    workers: list[asyncio.Task[Any] | None] = []
    order: list[int] = []

    async def quick(value: int) -> int:
        workers.append(asyncio.current_task())
        order.append(value)
        return value * 2

    assert owner.runner._queue is None  # nothing allocated for a connection without jobs
    for key in range(10):
        owner.submit(key, quick(key))
    assert owner.runner.jobs == 10 and len(owner.runner.workers()) == 1
    await owner.settled()
    assert order == list(range(10))
    assert owner.results == {key: key * 2 for key in range(10)}
    assert len(set(workers)) == 1 and workers[0] is not asyncio.current_task()
    assert owner.done == 10 and owner.runner.workers() == []  # the worker left when idle
    assert_clean(owner.runner)


async def test_a_waiting_handler_keeps_its_worker_and_the_queue_goes_on() -> None:
    owner = Owner()
    release = asyncio.Event()
    seen: dict[int, asyncio.Task[Any] | None] = {}

    async def slow(key: int) -> str:
        seen[key] = asyncio.current_task()
        await release.wait()
        assert asyncio.current_task() is seen[key]  # the same task for its whole run
        return "slow"

    async def quick(key: int) -> int:
        seen[key] = asyncio.current_task()
        return key

    owner.submit(0, slow(0))
    owner.submit(1, quick(1))
    owner.submit(2, slow(2))
    owner.submit(3, quick(3))
    async with asyncio.timeout(5):
        while len(owner.results) < 2:
            await asyncio.sleep(0)
    assert owner.results == {1: 1, 3: 3}  # not stuck behind 0 or 2
    assert seen[0] is not seen[2]  # each waiting handler holds a worker of its own
    assert owner.runner.jobs == 2 and len(owner.runner.workers()) == 2
    release.set()
    await owner.settled()
    assert owner.results == {0: "slow", 1: 1, 2: "slow", 3: 3}


async def test_jobs_queued_behind_one_that_waits_all_start_in_the_next_turn() -> None:
    """Ten jobs that all wait, queued at once: the first worker's job waits, and the nine
    behind it get a worker each at that moment, so all have started one loop turn later
    (not one turn after another: ten turns)."""
    owner = Owner()
    release = asyncio.Event()
    started: list[int] = []

    async def waits(key: int) -> int:
        started.append(key)
        await release.wait()
        return key

    for key in range(10):
        owner.submit(key, waits(key))
    await asyncio.sleep(0)  # turn 1: the first worker runs; its job waits
    assert started == [0]
    await asyncio.sleep(0)  # turn 2: the nine new workers run
    assert started == list(range(10))
    assert len(owner.runner.workers()) == 10
    release.set()
    await owner.settled()
    assert owner.results == {key: key for key in range(10)}
    assert owner.runner.workers() == []


async def test_workers_started_for_jobs_that_do_not_wait_find_nothing_and_leave() -> None:
    """One job waits with nine quick ones behind it: nine workers start, the first runs all
    nine quick jobs, the rest leave at once."""
    owner = Owner()
    release = asyncio.Event()

    async def waits() -> str:
        await release.wait()
        return "slow"

    async def quick(key: int) -> int:
        return key

    owner.submit(0, waits())
    for key in range(1, 10):
        owner.submit(key, quick(key))
    async with asyncio.timeout(5):
        while len(owner.results) < 9:
            await asyncio.sleep(0)
    assert owner.results == {key: key for key in range(1, 10)}
    await asyncio.sleep(0)  # the idle workers' own turn
    assert len(owner.runner.workers()) == 1  # only the waiting job's worker is left
    release.set()
    await owner.settled()
    assert owner.results[0] == "slow" and owner.runner.workers() == []


async def test_each_handler_runs_in_its_own_copy_of_the_submitters_context() -> None:
    owner = Owner()

    async def mark(key: int) -> str:
        before = MARK.get()
        MARK.set(f"set by {key}")  # never reset: must not reach the next handler
        await asyncio.sleep(0)
        return f"{before} -> {MARK.get()}"

    token = MARK.set("submitter")
    try:
        for key in range(4):
            owner.submit(key, mark(key))
    finally:
        MARK.reset(token)
    await owner.settled()
    assert owner.results == {key: f"submitter -> set by {key}" for key in range(4)}
    assert MARK.get() == "unset"


async def test_timeout_and_task_group_work_inside_and_leave_the_worker_clean() -> None:
    owner = Owner()

    async def times_out() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "not reached"

    async def grouped(value: int) -> int:
        async with asyncio.timeout(5), asyncio.TaskGroup() as group:
            doubled = group.create_task(asyncio.sleep(0, value * 2))
        return doubled.result()

    owner.submit(0, times_out())
    owner.submit(1, grouped(21))
    await owner.settled()
    assert owner.results == {0: "timed out", 1: 42}


async def test_cancel_ends_a_waiting_job_alone_and_its_worker_goes_on() -> None:
    owner = Owner()
    started = asyncio.Event()
    workers: list[asyncio.Task[Any] | None] = []

    async def waits() -> str:
        workers.append(asyncio.current_task())
        started.set()
        await asyncio.Event().wait()
        return "not reached"

    async def after(value: int) -> tuple[int, int]:
        task = asyncio.current_task()
        workers.append(task)
        assert task is not None
        return value, task.cancelling()  # the job's cancellation ended with it

    owner.submit(0, waits())
    await asyncio.wait_for(started.wait(), 5)
    owner.runner.cancel(0)
    owner.submit(1, after(1))  # queued before the worker wakes up
    await owner.settled()
    assert owner.results == {0: "cancelled", 1: (1, 0)}
    first = workers[0]
    assert first is not None and workers[1] is first  # the same worker went on
    assert first.done() and not first.cancelled()
    assert owner.runner.workers() == []
    assert_clean(owner.runner)


async def test_a_cancel_of_the_worker_with_a_cancel_of_its_job_ends_the_worker() -> None:
    """Two cancellations in one turn arrive as one CancelledError: the job's own is taken
    back, the worker's still stands, and the worker ends instead of going on."""
    owner = Owner()
    started = asyncio.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    async def after() -> str:
        return "must not run in the cancelled worker"

    owner.submit(0, waits())
    await asyncio.wait_for(started.wait(), 5)
    [worker] = owner.runner.workers()
    worker.cancel()  # e.g. the loop shutting down
    owner.runner.cancel(0)
    owner.submit(1, after())  # queued behind, for whichever worker is alive
    await asyncio.wait([worker], timeout=5)
    assert worker.cancelled() and owner.results[0] == "cancelled"
    await owner.settled()  # a new worker took the queued job
    assert owner.results[1] == "must not run in the cancelled worker"
    assert_clean(owner.runner)


async def test_a_job_that_raises_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = Owner()
    workers: list[asyncio.Task[Any] | None] = []

    async def broken() -> None:  # a job, unlike a handler, is not supposed to raise
        workers.append(asyncio.current_task())
        raise ValueError("a bug in a job")

    async def fine() -> int:
        workers.append(asyncio.current_task())
        return 1

    with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
        owner.runner.submit(0, broken())
        owner.submit(1, fine())
        await owner.settled()
    assert "a bug in a job" in caplog.text and owner.results == {1: 1}
    assert workers[0] is workers[1] and owner.done == 2
    assert_clean(owner.runner)


async def test_a_worker_cancelled_from_outside_ends_cancelled() -> None:
    """Only cancel() ends a job alone; cancelling the worker task itself (as a loop that
    shuts down does) ends the worker, as it would end a task of the handler's own."""
    owner = Owner()
    started = asyncio.Event()

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    owner.submit(0, waits())
    await asyncio.wait_for(started.wait(), 5)
    [worker] = owner.runner.workers()
    worker.cancel()
    await asyncio.wait([worker], timeout=5)
    assert worker.cancelled() and owner.results == {0: "cancelled"}
    assert owner.runner.workers() == [] and owner.runner.jobs == 0


async def test_cancel_drops_a_queued_job_unrun() -> None:
    owner = Owner()
    ran: list[int] = []

    async def job(key: int) -> int:
        ran.append(key)
        return key

    with no_coroutine_left_unawaited():
        for key in range(3):
            owner.submit(key, job(key))
        owner.runner.cancel(1)  # the worker has not run yet: all three are queued
        await owner.settled()
    assert ran == [0, 2] and owner.results == {0: 0, 2: 2}
    assert owner.runner.jobs == 0 and owner.done == 3  # the dropped job freed its slot too
    assert_clean(owner.runner)


async def test_drain_waits_for_the_jobs_submitted_so_far_only() -> None:
    """A graceful close waits for the requests being served when it starts, not for those
    that arrive while it waits (a worker that takes them must not keep it waiting)."""
    owner = Owner()
    assert owner.runner.drain() is None  # nothing to wait for
    first, later = asyncio.Event(), asyncio.Event()

    async def waits(event: asyncio.Event, value: int) -> int:
        await event.wait()
        return value

    owner.submit(0, waits(first, 0))
    owner.submit(1, waits(first, 1))
    drained = owner.runner.drain()
    assert drained is not None
    owner.submit(2, waits(later, 2))  # arrives while the close waits
    await asyncio.sleep(0)
    assert not drained.done()
    first.set()
    await asyncio.wait_for(drained, 5)  # without job 2, which still waits
    assert owner.results == {0: 0, 1: 1} and owner.runner.jobs == 1
    later.set()
    await owner.settled()
    assert owner.results[2] == 2
    assert_clean(owner.runner)


async def test_close_cancels_waiting_jobs_and_closes_queued_ones_unrun() -> None:
    owner = Owner()
    started = asyncio.Event()
    ran: list[int] = []

    async def waits() -> None:
        started.set()
        await asyncio.Event().wait()

    async def job(key: int) -> int:
        ran.append(key)
        return key

    owner.submit(0, waits())
    await asyncio.wait_for(started.wait(), 5)
    workers = owner.runner.workers()
    with no_coroutine_left_unawaited():
        owner.submit(1, job(1))
        owner.submit(2, job(2))
        owner.runner.close()
        await asyncio.wait(workers, timeout=5)
    assert owner.results == {0: "cancelled"} and ran == []
    assert all(task.done() for task in workers) and owner.runner.workers() == []


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_peers_coroutine_handlers_share_workers_and_not_their_context(
    flavour: str,
) -> None:
    """Over a real connection: 50 requests sent together are served by fewer worker tasks
    than requests, each handler sees its connection and a context of its own."""
    reg = rpc.Registry()
    workers: set[asyncio.Task[Any] | None] = set()
    seen: list[str] = []

    @reg.handle("mark")
    async def mark(value: int) -> int:
        workers.add(asyncio.current_task())  # held: no id reused by a later task
        seen.append(MARK.get())
        MARK.set(f"set by {value}")
        assert rpc.current_peer.get() is not None
        return value

    async with served(flavour, reg) as (server, peer):
        assert await asyncio.gather(*(peer.request("mark", i) for i in range(50))) == list(
            range(50)
        )
        [server_peer] = server.peers
        assert server_peer.handlers_running == 0
    assert seen == ["unset"] * 50
    assert None not in workers and 1 <= len(workers) < 50

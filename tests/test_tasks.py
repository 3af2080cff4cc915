"""rpc.tasks.TaskSet: tasks that leave the set by themselves, and coroutine handlers, run by
the peer's workers, that behave as tasks (asyncio.timeout and TaskGroup work in them) and
see their own context."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from rpc.tasks import TaskSet
from tests.rpc_helpers import served


async def test_spawn_logs_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet(asyncio.get_running_loop())

    async def fails() -> None:
        raise ValueError("broken")

    with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
        task = tasks.spawn(fails())
        assert await tasks.wait(timeout=5)  # True only once its done callback has run
    assert task.done() and isinstance(task.exception(), ValueError)
    assert "broken" in caplog.text


async def test_start_leaving_tasks_leave_by_themselves() -> None:
    """A task started with start_leaving leaves the set from its own finally (on_done once
    per task); one cancelled before it ever ran (its finally never runs) leaves through
    cancel(); cancel_all leaves nothing behind."""
    done: list[int] = []
    tasks = TaskSet(asyncio.get_running_loop(), lambda: done.append(len(tasks)))
    release = asyncio.Event()

    async def leaving(wait: bool) -> str:
        try:
            if wait:
                await release.wait()
            return "ok"
        finally:
            tasks.leave(asyncio.current_task())

    quick = tasks.start_leaving(leaving(False))
    assert await quick == "ok"
    assert len(tasks) == 0
    assert done == [0]

    waiting = tasks.start_leaving(leaving(True))
    unstarted = tasks.start_leaving(leaving(True))
    assert len(tasks) == 2
    tasks.cancel(unstarted)
    release.set()
    assert await waiting == "ok"
    with pytest.raises(asyncio.CancelledError):
        await unstarted
    assert await tasks.wait(timeout=5) and len(tasks) == 0
    assert len(done) == 3

    release.clear()
    for _ in range(3):
        tasks.start_leaving(leaving(True))
    tasks.cancel_all()
    assert await tasks.wait(timeout=5) and len(tasks) == 0


async def test_start_leaving_honours_a_task_factory_set_before_the_set() -> None:
    """Without a task factory start_leaving builds the task itself; a factory the loop had
    when the set was made still gets every task."""
    loop = asyncio.get_running_loop()
    made: list[object] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def leaving(tasks: TaskSet) -> int:
        try:
            return 1
        finally:
            tasks.leave(asyncio.current_task())

    plain = TaskSet(loop)
    assert await plain.start_leaving(leaving(plain)) == 1 and made == []
    loop.set_task_factory(factory)
    try:
        with_factory = TaskSet(loop)
        assert await with_factory.start_leaving(leaving(with_factory)) == 1
        assert len(made) == 1 and len(with_factory) == 0
    finally:
        loop.set_task_factory(None)


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current", "chatter-legacy"])
async def test_coroutine_handlers_keep_task_semantics(flavour: str) -> None:
    """asyncio.timeout and TaskGroup need a current task: eager start must provide one."""
    reg = rpc.Registry()

    @reg.handle("quick")
    async def quick(value: int) -> int:
        return value + 1

    @reg.handle("grouped")
    async def grouped(value: int) -> int:
        async with asyncio.timeout(5):
            async with asyncio.TaskGroup() as group:
                doubled = group.create_task(asyncio.sleep(0, value * 2))
            return doubled.result()

    async with served(flavour, reg) as (_server, peer):
        assert await peer.request("quick", 1) == 2
        assert await peer.request("grouped", 21) == 42
        assert await asyncio.gather(*(peer.request("quick", i) for i in range(50))) == [
            i + 1 for i in range(50)
        ]


LEAK: contextvars.ContextVar[str] = contextvars.ContextVar("peerwire_test_leak", default="unset")


@contextlib.asynccontextmanager
async def one_slot(reg: rpc.Registry) -> AsyncIterator[rpc.Peer]:
    """A client of a server with one handler slot: requests past the first wait in the
    server peer's backlog (no retry results: held back rather than answered with one)."""
    async with (
        rpc.serve(
            "tcp+gotalk://127.0.0.1:0",
            registry=reg,
            options=rpc.Options(max_concurrent=1),
            retry_results=False,
        ) as server,
        rpc.connect(str(server.url), registry=rpc.Registry(), reconnect=False) as peer,
    ):
        yield peer


async def test_held_back_requests_do_not_inherit_a_finished_handlers_context() -> None:
    """With every handler slot taken, requests wait in the peer's backlog; the handler task
    that frees a slot starts the next turn at it, which must not run in that task's context
    (a variable the handler set and never reset would reach the next request)."""
    reg = rpc.Registry()
    seen: list[str] = []

    @reg.handle("mark")
    async def mark(value: int) -> int:
        seen.append(LEAK.get())
        LEAK.set(f"set by request {value}")
        await asyncio.sleep(0)
        return value

    async with one_slot(reg) as peer:
        assert await asyncio.gather(*(peer.request("mark", i) for i in range(8))) == list(range(8))
    assert seen == ["unset"] * 8


async def test_held_back_requests_see_their_own_peer() -> None:
    """current_peer is set per batch, for a turn at the backlog too: plain and coroutine
    handlers of requests that waited there (every slot taken) each see their connection."""
    reg = rpc.Registry()

    @reg.handle("who")
    async def who(_value) -> int:
        await asyncio.sleep(0)
        return rpc.current_peer.get().remote_address[1]

    @reg.handle("who_now")
    def who_now(_value) -> int:
        return rpc.current_peer.get().remote_address[1]

    async with one_slot(reg) as peer:
        mine = peer.transport.get_extra_info("sockname")[1]
        calls = [peer.request(op) for _ in range(8) for op in ("who", "who_now")]
        assert await asyncio.gather(*calls) == [mine] * 16

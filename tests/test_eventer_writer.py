"""The Eventer's group-commit writer on a real SQLite store: commits release registrants and
queries in order; however the writer ends, nobody is left waiting."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rpc.eventer import common
from rpc.eventer.sessions import Registrar, Session, SessionFuture, TypeCatalog
from rpc.eventer.store import Store
from rpc.eventer.writer import Writer


def register_req(*names: str) -> bytes:
    events = [common.RegisterEvent(("w", n), None, common.EventPayloadJson(n)) for n in names]
    return common.encode(common.MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in events])


async def test_commits_release_registrants_and_queries_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    committed: list[int] = []
    with ThreadPoolExecutor(1) as writer_exec, ThreadPoolExecutor(1) as checkpoint_exec:
        writer = Writer(
            store,
            catalog,
            inline_commits=False,
            writer_exec=writer_exec,
            checkpoint_exec=checkpoint_exec,
            on_commit=lambda session: committed.append(session.id),
            processed=0,
        )
        loop = asyncio.get_running_loop()
        futures: list[SessionFuture] = []
        for name in ("a", "b", "c"):
            future: SessionFuture = loop.create_future()
            writer.push(registrar.session(common.split_register_req(register_req(name)), future))
            futures.append(future)
        barrier = asyncio.ensure_future(writer.wait_processed(3))
        task = asyncio.ensure_future(writer.run())
        try:
            await asyncio.wait_for(barrier, 10)
            assert committed == [1, 2, 3] and writer.processed == 3
            assert [len(f.result() or []) for f in futures] == [1, 1, 1]
            assert writer.pending_events == 0
            assert len(store.query_server(1, None, 10, 1 << 20)[0]) == 3
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        store.close()


async def test_a_stopped_writer_leaves_nobody_waiting(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    blocker = threading.Event()
    with ThreadPoolExecutor(1) as writer_exec, ThreadPoolExecutor(1) as checkpoint_exec:
        writer_exec.submit(blocker.wait, 10)  # the commit cannot run until released
        writer = Writer(
            store,
            catalog,
            inline_commits=False,
            writer_exec=writer_exec,
            checkpoint_exec=checkpoint_exec,
            on_commit=lambda session: None,
            processed=0,
        )
        loop = asyncio.get_running_loop()
        first: SessionFuture = loop.create_future()
        writer.push(registrar.session(common.split_register_req(register_req("a")), first))
        task = asyncio.ensure_future(writer.run())
        second: SessionFuture = loop.create_future()
        writer.push(registrar.session(common.split_register_req(register_req("b")), second))
        query = asyncio.ensure_future(writer.wait_processed(2))
        task.cancel()  # whether or not the first batch was taken
        with contextlib.suppress(asyncio.CancelledError):
            await task
        writer.stop()
        assert writer.stopped
        assert await asyncio.wait_for(first, 5) is None
        assert await asyncio.wait_for(second, 5) is None
        await asyncio.wait_for(query, 5)
        await asyncio.wait_for(writer.wait_processed(2), 5)
        late_future: SessionFuture = loop.create_future()
        late = Session(3, late_future)
        writer.push(late)
        assert late_future.result() is None and writer.pending_events == 0
        blocker.set()
    store.close()


async def test_a_failure_after_the_commit_answers_the_registrant_and_goes_on(
    tmp_path: Path,
) -> None:
    """``on_commit`` (the fan-out) raising used to end the writer: that registrant was never
    answered and every later registration failed."""
    store = Store(tmp_path / "w.db")
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    notified: list[int] = []

    def on_commit(session: Session) -> None:
        if session.id == 1:
            raise RecursionError("maximum recursion depth exceeded")
        notified.append(session.id)

    with ThreadPoolExecutor(1) as writer_exec, ThreadPoolExecutor(1) as checkpoint_exec:
        writer = Writer(
            store,
            catalog,
            inline_commits=False,
            writer_exec=writer_exec,
            checkpoint_exec=checkpoint_exec,
            on_commit=on_commit,
            processed=0,
        )
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(writer.run())
        try:
            for name in ("a", "b"):
                future: SessionFuture = loop.create_future()
                writer.push(
                    registrar.session(common.split_register_req(register_req(name)), future)
                )
                assert len(await asyncio.wait_for(future, 5) or []) == 1
            assert notified == [2] and not writer.stopped
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    store.close()

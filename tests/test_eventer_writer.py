"""The Eventer's group-commit writer on a real SQLite store: commits release registrants and
queries in order; however the writer ends, nobody is left waiting."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rpc.eventer import common
from rpc.eventer.common import EventType
from rpc.eventer.sessions import Registrar, Session, SessionFuture, TypeCatalog
from rpc.eventer.store import LatestRow, Row, Store
from rpc.eventer.values import timestamp_key
from rpc.eventer.wal import Watch, log_bound
from rpc.eventer.writer import Writer
from tests.rpc_helpers import in_background


def register_req(*names: str) -> bytes:
    events = [common.RegisterEvent(("w", n), None, common.EventPayloadJson(n)) for n in names]
    return common.encode(common.MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in events])


@contextlib.contextmanager
def writer_on_threads(
    store: Store,
    catalog: TypeCatalog,
    *,
    inline: bool,
    on_commit: Callable[[Session], None] = lambda session: None,
    processed: int = 0,
) -> Iterator[Writer]:
    """A writer on executors of its own (a thread each), shut down on exit."""
    with ThreadPoolExecutor(1) as writer_exec, ThreadPoolExecutor(1) as checkpoint_exec:
        yield Writer(
            store,
            catalog,
            inline_commits=inline,
            writer_exec=writer_exec,
            checkpoint_exec=checkpoint_exec,
            on_commit=on_commit,
            processed=processed,
        )


async def test_commits_release_registrants_and_queries_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "w.db")
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    committed: list[int] = []
    with writer_on_threads(
        store, catalog, inline=False, on_commit=lambda session: committed.append(session.id)
    ) as writer:
        loop = asyncio.get_running_loop()
        futures: list[SessionFuture] = []
        for name in ("a", "b", "c"):
            future: SessionFuture = loop.create_future()
            writer.push(registrar.session(common.split_register_req(register_req(name)), future))
            futures.append(future)
        barrier = asyncio.ensure_future(writer.wait_processed(3))
        async with in_background(writer.run()):
            await asyncio.wait_for(barrier, 10)
            assert committed == [1, 2, 3] and writer.processed == 3
            assert [len(f.result() or []) for f in futures] == [1, 1, 1]
            assert writer.pending_events == 0
            assert len(store.query_server(1, None, 10, 1 << 20)[0]) == 3
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

    with writer_on_threads(store, catalog, inline=False, on_commit=on_commit) as writer:
        loop = asyncio.get_running_loop()
        async with in_background(writer.run()):
            for name in ("a", "b"):
                future: SessionFuture = loop.create_future()
                writer.push(
                    registrar.session(common.split_register_req(register_req(name)), future)
                )
                assert len(await asyncio.wait_for(future, 5) or []) == 1
            assert notified == [2] and not writer.stopped
    store.close()


class CountingStore(Store):
    """The real store, counting how often the writer reads the ``-wal`` file's size."""

    size_reads = 0

    def wal_size(self) -> int:
        self.size_reads += 1
        return super().wal_size()


async def test_a_commit_reads_the_wal_size_only_when_it_may_have_passed_a_threshold(
    tmp_path: Path,
) -> None:
    """Before, every commit read the size (an ``os.stat``): 200 times here. A small commit
    writes at most 99 KiB of log (about 30 KiB): 170 of them cannot take the file from
    empty past the 16 MiB checkpoint threshold."""
    store = CountingStore(tmp_path / "w.db", sync="normal")
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    with writer_on_threads(store, catalog, inline=True) as writer:
        loop = asyncio.get_running_loop()
        async with in_background(writer.run()):
            for i in range(200):
                future: SessionFuture = loop.create_future()
                request = register_req(str(i % 20))
                writer.push(registrar.session(common.split_register_req(request), future))
                assert len(await asyncio.wait_for(future, 5) or []) == 1
    assert 0 < store.wal_size() < store.max_wal_bytes // 4
    # before the first commit, once the commits' bound (99 KiB each) passed 16 MiB, and here
    assert store.size_reads <= 3, store.size_reads
    store.close()


def test_a_file_left_at_the_checkpoint_threshold_is_not_read_after_every_commit() -> None:
    """A restart leaves the file at M/4 (``journal_size_limit``) while the log refills it
    from the start: the size is read again once M/32 more may have been written, and it
    is read before any commit can have taken the file to the truncation threshold."""
    mib = 1 << 20
    watch = Watch(64 * mib)
    assert watch.due(can_checkpoint=True)  # never read yet
    watch.measured(16 * mib)
    watch.wrote(log_bound(1, 200))
    assert not watch.due(can_checkpoint=True)
    watch.wrote(2 * mib)
    assert watch.due(can_checkpoint=True)
    watch.measured(20 * mib)
    watch.wrote(12 * mib - 1)
    assert not watch.due(can_checkpoint=False)  # a checkpoint runs: only truncation matters
    watch.wrote(1)
    assert watch.due(can_checkpoint=False)


async def test_a_group_commit_of_many_types_writes_about_an_eighth_of_max_wal_bytes(
    tmp_path: Path,
) -> None:
    """Each event of a type new to the batch lands in a leaf of its own of each type index
    (and, with its source timestamp, of two). Before, the batch cut counted about 640 bytes
    of log for such an event, not 8 KiB: 200 of them went in one commit that wrote 1.5 MB
    of log, past ``max_wal_bytes`` (1 MiB) at once."""
    limit = 1 << 20
    store = Store(tmp_path / "w.db", sync="normal", max_wal_bytes=limit)
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    type_ids = [catalog.id_of(("w", str(i))) for i in range(2000)]
    for session in range(1, 41):  # 20 events of each type: the type indexes span 250 leaves
        rows: list[Row] = [
            (1, session, i + 1, type_ids[i % 2000], i, timestamp_key(i, 0), b"x" * 40)
            for i in range(1000)
        ]
        store.write(catalog.unsaved(), rows, [])
        catalog.saved(catalog.unsaved())
    assert store.truncate_wal()
    registrar = Registrar(
        1, catalog, last_session=40, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    wal_sizes: list[int] = []
    with writer_on_threads(
        store,
        catalog,
        inline=True,
        on_commit=lambda session: wal_sizes.append(store.wal_size()),
        processed=40,
    ) as writer:
        loop = asyncio.get_running_loop()
        futures: list[SessionFuture] = []
        for k in range(250):  # types 8 apart: a leaf each
            event = common.RegisterEvent(
                ("w", str(8 * k)), common.Timestamp(k, 0), common.EventPayloadJson(k)
            )
            request = common.encode(common.MSG_REGISTER_REQ, [common.register_event_to_sbs(event)])
            future: SessionFuture = loop.create_future()
            writer.push(registrar.session(common.split_register_req(request), future))
            futures.append(future)
        async with in_background(writer.run()):
            await asyncio.wait_for(writer.wait_processed(290), 10)
    assert all(f.result() for f in futures)
    assert max(wal_sizes) < limit, f"the -wal file reached {max(wal_sizes)} bytes"
    store.close()


async def test_a_large_session_finds_the_log_emptied_when_it_could_take_it_past_the_limit(
    tmp_path: Path,
) -> None:
    """The log is truncated past M/2 after a commit: before, a session whose commit writes
    more than M/2 (300 events of 1 KiB, 1.5 MB of log) on a file just under M/2 took it
    past M (2.4 MB for 2 MiB). Now the file is emptied before such a commit."""
    limit = 2 << 20
    store = Store(tmp_path / "w.db", sync="normal", max_wal_bytes=limit)
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    filler = catalog.id_of(("filler",))
    for session in range(1, 100):  # about 0.9 MiB of log, under the truncation threshold
        store.write(catalog.unsaved(), [(1, session, 1, filler, session, None, b"x" * 5000)], [])
        catalog.saved(catalog.unsaved())
        if store.wal_size() >= 900_000:
            break
    assert 900_000 <= store.wal_size() < limit // 2
    registrar = Registrar(
        1,
        catalog,
        last_session=session,
        last_ts=0,
        max_event_bytes=1 << 20,
        max_message_size=1 << 20,
    )
    wal_sizes: list[int] = []
    with writer_on_threads(
        store,
        catalog,
        inline=True,
        on_commit=lambda session: wal_sizes.append(store.wal_size()),
        processed=session,
    ) as writer:
        events = [
            common.RegisterEvent(("big",), None, common.EventPayloadBinary("b", b"y" * 960))
            for _ in range(300)
        ]
        request = common.encode(
            common.MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in events]
        )
        future: SessionFuture = asyncio.get_running_loop().create_future()
        writer.push(registrar.session(common.split_register_req(request), future))
        async with in_background(writer.run()):
            assert len(await asyncio.wait_for(future, 10) or []) == 300
    assert wal_sizes and wal_sizes[0] < limit, f"the -wal file reached {wal_sizes[0]} bytes"
    store.close()


class TruncationCountingStore(Store):
    """The real store, recording the writer's commits (their event counts) and truncations
    of the ``-wal`` file, in order (the writer's thread appends; the test reads after it
    ended)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[str] = []

    def write(
        self, types: list[tuple[int, EventType]], rows: list[Row], latest: list[LatestRow]
    ) -> None:
        self.steps.append(f"commit {len(rows)}")
        super().write(types, rows, latest)

    def truncate_wal(self) -> bool:
        self.steps.append("truncate")
        return super().truncate_wal()


async def test_a_small_batch_ahead_of_a_large_session_does_not_truncate_for_it(
    tmp_path: Path,
) -> None:
    """A batch is cut before a session that would take it past M/8: that session's estimate
    was left in the batch's, so a small batch ahead of a large session (about 2 MiB of log
    estimated for 1 MiB) read the file and truncated it for a commit that did not need it,
    then the large one truncated it again. Now only the large one does, before its commit.
    (After it, the 1.4 MiB of log it wrote is truncated too, unless the test ended the
    writer first: the steps past the large commit are not checked.)"""
    store = TruncationCountingStore(tmp_path / "w.db", sync="normal", max_wal_bytes=1 << 20)
    state = store.open(1)
    catalog = TypeCatalog(state.types)
    registrar = Registrar(
        1, catalog, last_session=0, last_ts=0, max_event_bytes=1 << 20, max_message_size=1 << 20
    )
    big = [
        common.RegisterEvent(("big",), None, common.EventPayloadBinary("b", b"y" * 960))
        for _ in range(300)
    ]
    requests = [register_req("warm"), register_req("small")]
    requests.append(
        common.encode(common.MSG_REGISTER_REQ, [common.register_event_to_sbs(e) for e in big])
    )
    with writer_on_threads(store, catalog, inline=True) as writer:
        loop = asyncio.get_running_loop()
        futures: list[SessionFuture] = [loop.create_future() for _ in requests]
        async with in_background(writer.run()):
            # the first commit reads the size (never read yet); the next two come together
            writer.push(registrar.session(common.split_register_req(requests[0]), futures[0]))
            await asyncio.wait_for(futures[0], 5)
            for request, future in zip(requests[1:], futures[1:], strict=True):
                writer.push(registrar.session(common.split_register_req(request), future))
            done = await asyncio.wait_for(asyncio.gather(*futures[1:]), 10)
    assert [len(d or []) for d in done] == [1, 300]
    assert store.steps[:4] == ["commit 1", "commit 1", "truncate", "commit 300"], store.steps
    store.close()

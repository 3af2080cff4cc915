"""The single writer: queued sessions committed in group commits, then released.

Sessions queue in arrival order; the writer commits everything queued (up to
:data:`MAX_BATCH_EVENTS` events, and about an eighth of ``max_wal_bytes`` of log, see
:func:`wal_estimate`; a larger session alone) in one SQLite transaction on its own thread
(a batch of at most :data:`INLINE_COMMIT_ROWS` events on the event loop itself when
``sync = "normal"``, which does not wait for the disk), then hands each session to
``on_commit`` (notification) and answers its registrant, and releases the queries waiting
for it. A failure of ``on_commit`` is logged: the session is committed, so it is answered
all the same and the writer goes on (one bad session must not stop every later
registration). A failed commit fails its registrations; its traceback is logged once per
:data:`FAILURE_LOG_WINDOW` (a failing disk fails every commit), the others counted and
the count logged with the next, and the first commit that succeeds again says how many
failed.

The ``-wal`` file (:mod:`rpc.eventer.wal`), measured after each commit, is kept under the
store's ``max_wal_bytes`` (M): past M/4 a PASSIVE checkpoint runs on another thread, off
the commit path (again past M/4 once one completed, else once the file grew M/8 more);
past M/2, when PASSIVE ones could not complete (readers overlapping, commits during the
copy), the writer truncates it between two commits. The next commit waits for that: the
end of a PASSIVE one running, the copy of what is left, and up to
:data:`~rpc.eventer.wal.TRUNCATE_ATTEMPTS` times :data:`~rpc.eventer.wal.TRUNCATE_WAIT_MS`
for older readers; given up past that (a reader holding a snapshot that long), it is tried
again M/8 later, with a rate-limited warning. So the file stays under about M/2 plus one
batch's log, below M when sessions are at most M/4 (``max_message_size`` 16 MiB and M
64 MiB by default), unless readers hold snapshots for longer than those waits.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rpc.eventer.sessions import Session, TypeCatalog
from rpc.eventer.store import LatestRow, Store, StoreError
from rpc.eventer.wal import TRUNCATE_ATTEMPTS, TRUNCATE_WAIT_MS
from transports.logs import RateLimitedLog

log = logging.getLogger("peerwire.eventer.server")

MAX_BATCH_EVENTS = 50_000
"""Events written in one transaction at most (bounds commit latency)."""
INLINE_COMMIT_ROWS = 8
"""With ``sync = "normal"`` (no fsync), batches up to this size commit on the event loop
thread: about 60 us, less than the round trip to the writer thread."""
FAILURE_LOG_WINDOW = 60.0
"""Seconds per logged traceback of a failed commit (and per WAL warning)."""


def wal_estimate(session: Session) -> int:
    """Log bytes a session's commit may write, roughly, for cutting batches: the pages of
    its rows and four indexes. Measured: 2.4 to 2.8 times the event bytes for small
    events, 4.8 for events of about 1 KiB (an overflow page each), 1.1 to 1.3 for large
    ones."""
    return 2 * session.size + 512 * len(session.rows)


class Writer:
    """Commits queued sessions; :meth:`run` is its loop (one task, owned by the caller)."""

    def __init__(
        self,
        store: Store,
        catalog: TypeCatalog,
        *,
        inline_commits: bool,
        writer_exec: ThreadPoolExecutor,
        checkpoint_exec: ThreadPoolExecutor,
        on_commit: Callable[[Session], None],
        processed: int,
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._inline = inline_commits
        self._writer_exec = writer_exec
        self._checkpoint_exec = checkpoint_exec
        self._on_commit = on_commit
        self.processed = processed
        """Id of the last session whose commit is over (done or failed)."""
        self.pending_events = 0
        """Events queued or being committed."""
        self.pending_bytes = 0
        """Bytes of those events (:attr:`Session.size`)."""
        self.stopped = False
        """Set when :meth:`run` has ended (cancelled, or failed unexpectedly)."""
        self._pending: deque[Session] = deque()
        self._last_pushed = processed
        self._wake = asyncio.Event()
        self._barriers: list[tuple[int, asyncio.Future[None]]] = []
        self._checkpoint: asyncio.Future[bool] | None = None
        """The WAL checkpoint running on its thread, if one is."""
        quarter = store.max_wal_bytes // 4
        self._checkpoint_at = quarter
        """WAL size past which the next PASSIVE checkpoint starts."""
        self._truncate_at = 2 * quarter
        """WAL size from which the writer truncates it."""
        self._batch_wal = store.max_wal_bytes // 8
        self.failed_commits = 0
        """Commits that failed since the writer started."""
        self._failed_in_a_row = 0
        self._failures = RateLimitedLog(log, burst=1, window=FAILURE_LOG_WINDOW)
        self._recoveries = RateLimitedLog(log, burst=1, window=FAILURE_LOG_WINDOW)
        self._wal_warnings = RateLimitedLog(log, burst=1, window=FAILURE_LOG_WINDOW)

    def push(self, session: Session) -> None:
        """Queue a session with events for the next commit (failed at once if the writer
        has stopped)."""
        if self.stopped:
            session.resolve(None)
            return
        self._last_pushed = session.id
        self._pending.append(session)
        self.pending_events += len(session.rows)
        self.pending_bytes += session.size
        self._wake.set()

    async def wait_processed(self, session_id: int) -> None:
        """Return once the commit of every session up to ``session_id`` is over (at once
        if the writer has stopped)."""
        if session_id <= self.processed or self.stopped:
            return
        future = asyncio.get_running_loop().create_future()
        self._barriers.append((session_id, future))
        await future

    async def run(self) -> None:
        """Commit what is queued, batch after batch, until cancelled. However it ends,
        registrants still waiting get a failure and waiting queries are released."""
        try:
            await self._commit_forever()
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop taking sessions: fail those still queued and release every waiter
        (idempotent; :meth:`run` calls it when it ends, its owner after cancelling it)."""
        self.stopped = True
        for session in self._pending:
            session.resolve(None)
        self._pending.clear()
        self.pending_events = self.pending_bytes = 0
        self.processed = max(self.processed, self._last_pushed)
        self._release_barriers()

    async def _commit_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch: list[Session] = []
            count = estimate = 0
            while self._pending and count < MAX_BATCH_EVENTS:
                estimate += wal_estimate(self._pending[0])
                if batch and estimate > self._batch_wal:
                    break
                session = self._pending.popleft()
                batch.append(session)
                count += len(session.rows)
            rows = [row for session in batch for row in session.rows]
            latest: dict[int, LatestRow] = {}
            for server, session_id, instance, type_id, ts, _, _ in rows:
                latest[type_id] = (type_id, server, session_id, instance, ts)
            types = self._catalog.unsaved()
            try:
                if count <= INLINE_COMMIT_ROWS and self._inline:
                    # no fsync: a tiny commit costs less than two thread hops
                    self._store.write(types, rows, list(latest.values()))
                else:
                    await loop.run_in_executor(
                        self._writer_exec, self._store.write, types, rows, list(latest.values())
                    )
            except (sqlite3.Error, StoreError):
                self.failed_commits += 1
                self._failed_in_a_row += 1
                self._failures.exception(
                    "commit of %d events failed; their registrations fail "
                    "(%d commits failed in a row)",
                    count,
                    self._failed_in_a_row,
                )
                for session in batch:
                    session.resolve(None)
            except BaseException:  # cancelled or an unexpected failure: run() ends
                for session in batch:
                    session.resolve(None)
                raise
            else:
                if self._failed_in_a_row:
                    self._recoveries.warning(
                        "commits succeed again, after %d failed", self._failed_in_a_row
                    )
                    self._failed_in_a_row = 0
                self._catalog.saved(types)
                for session in batch:
                    try:
                        self._on_commit(session)
                    except Exception:  # committed all the same: answered, and on we go
                        log.exception("session %d committed, but notifying it failed", session.id)
                    session.resolve(session.blobs)
            finally:
                self.pending_events -= count
                self.pending_bytes -= sum(session.size for session in batch)
            self.processed = batch[-1].id
            if self._barriers:
                self._release_barriers()
            if self._failed_in_a_row == 0:
                await self._keep_wal_small()

    async def wait_checkpoint(self) -> None:
        """Wait for a running checkpoint (its failure is logged, not raised)."""
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])

    async def _keep_wal_small(self) -> None:
        """After a commit: start a PASSIVE checkpoint, or truncate the log once the one
        running ended (see the module's text for when)."""
        store = self._store
        size = store.wal_size()
        if size >= self._truncate_at:
            if self._checkpoint is not None:  # one checkpoint at a time (SQLite's lock)
                await asyncio.wait([self._checkpoint])
            loop = asyncio.get_running_loop()
            try:
                done = await loop.run_in_executor(self._writer_exec, store.truncate_wal)
            except (sqlite3.Error, StoreError) as exc:
                done = False
                self._wal_warnings.warning("WAL truncation failed: %s", exc)
            if done:
                self._checkpoint_at = store.max_wal_bytes // 4
                self._truncate_at = store.max_wal_bytes // 2
            else:
                self._truncate_at = size + store.max_wal_bytes // 8
                self._wal_warnings.warning(
                    "WAL of %d bytes not truncated: readers on older snapshots did not end "
                    "within %d tries of %d ms; trying again at %d bytes",
                    size,
                    TRUNCATE_ATTEMPTS,
                    TRUNCATE_WAIT_MS,
                    self._truncate_at,
                )
        elif size > self._checkpoint_at and self._checkpoint is None:
            self._start_checkpoint()

    def _start_checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._checkpoint_exec, self._store.checkpoint)
        self._checkpoint = future

        def done(f: asyncio.Future[bool]) -> None:
            self._checkpoint = None
            quarter = self._store.max_wal_bytes // 4
            if f.cancelled() or f.exception() is not None:
                self._checkpoint_at = self._store.wal_size() + quarter // 2
                if not f.cancelled():
                    self._wal_warnings.warning("WAL checkpoint failed: %s", f.exception())
            elif f.result():  # all copied: the next commit restarts the log, cut to M/4
                self._checkpoint_at = quarter
            else:
                self._checkpoint_at = self._store.wal_size() + quarter // 2

        future.add_done_callback(done)

    def _release_barriers(self) -> None:
        waiting = []
        for target, future in self._barriers:
            if target <= self.processed:
                if not future.done():
                    future.set_result(None)
            else:
                waiting.append((target, future))
        self._barriers = waiting

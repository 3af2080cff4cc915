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

The ``-wal`` file (:mod:`rpc.eventer.wal`) is kept under the store's ``max_wal_bytes``
(M); its size is read only when what was committed since the last read may have taken it
past a threshold (:class:`~rpc.eventer.wal.Watch`: most commits read nothing). Past M/4
(up to M/32 later) a PASSIVE checkpoint runs on another thread, off the commit path (again
past M/4 once one completed, else once the file grew M/8 more); past M/2, when PASSIVE
ones could not complete (readers overlapping, commits during the copy), the writer
truncates it between two commits, and before a commit that could take it to M (a large
session). The next commit waits for that: the end of a PASSIVE one running, the copy of
what is left, and up to :data:`~rpc.eventer.wal.TRUNCATE_ATTEMPTS` times
:data:`~rpc.eventer.wal.TRUNCATE_WAIT_MS` for older readers; given up past that (a reader
holding a snapshot that long), it is tried again M/8 later, with a rate-limited warning.
So the file stays under about M/2 plus M/8 (a batch's log, :func:`wal_estimate`), about M
after a larger session, unless one session alone writes more than M (a session is one
transaction) or readers hold snapshots for longer than those waits.
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
from rpc.eventer.wal import FRAME_BYTES, TRUNCATE_ATTEMPTS, TRUNCATE_WAIT_MS, Watch, log_bound
from transports.logs import RateLimitedLog

log = logging.getLogger("peerwire.eventer.server")

MAX_BATCH_EVENTS = 50_000
"""Events written in one transaction at most (bounds commit latency)."""
INLINE_COMMIT_ROWS = 8
"""With ``sync = "normal"`` (no fsync), batches up to this size commit on the event loop
thread: about 60 us, less than the round trip to the writer thread."""
FAILURE_LOG_WINDOW = 60.0
"""Seconds per logged traceback of a failed commit (and per WAL warning)."""


OVERFLOW_FROM = 960
"""Events of this many bytes or more do not fit their leaf (a record of more than 1,002
bytes on 4 KiB pages): each starts an overflow page of its own."""
COMMIT_PAGES = 6
"""Pages of log any commit writes (the leaves its rows land in, the database header)."""


def wal_estimate(session: Session, new_types: int) -> int:
    """Log bytes a session's commit may write, roughly, for cutting batches: twice its
    bytes, 512 an event (its index entries), a page per event that overflows its leaf
    and two per type new to the batch (a leaf of each type index, wherever the type's
    events are). Before the last two, it was 10 to 16 times too low for events of
    hundreds of types in a large database, and 2.6 times for events of about 1 KiB."""
    overflowing = 0
    if session.size >= OVERFLOW_FROM:  # else none of its events can overflow
        overflowing = sum(len(row[6]) >= OVERFLOW_FROM for row in session.rows)
    return 2 * session.size + 512 * len(session.rows) + FRAME_BYTES * (overflowing + 2 * new_types)


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
        self._wal = Watch(store.max_wal_bytes)
        """The WAL's thresholds, and whether its size must be read after a commit."""
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
            count, estimate = 0, COMMIT_PAGES * FRAME_BYTES
            batch_types: set[int] = set()
            while self._pending and count < MAX_BATCH_EVENTS:
                session_types = {row[3] for row in self._pending[0].rows}
                cost = wal_estimate(self._pending[0], len(session_types - batch_types))
                if batch and estimate + cost > self._wal.step:
                    break  # the batch's estimate, for fits(), is of what it holds
                estimate += cost
                batch_types |= session_types
                session = self._pending.popleft()
                batch.append(session)
                count += len(session.rows)
            rows = [row for session in batch for row in session.rows]
            latest: dict[int, LatestRow] = {}
            for server, session_id, instance, type_id, ts, _, _ in rows:
                latest[type_id] = (type_id, server, session_id, instance, ts)
            types = self._catalog.unsaved()
            try:
                if not self._wal.fits(estimate):  # a large batch: the file read first
                    await self._make_room(estimate)
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
                size = sum(session.size for session in batch)
                self.pending_events -= count
                self.pending_bytes -= size
                self._wal.wrote(log_bound(count, size))
            self.processed = batch[-1].id
            if self._barriers:
                self._release_barriers()
            if self._failed_in_a_row == 0 and self._wal.due(self._checkpoint is None):
                await self._keep_wal_small()

    async def wait_checkpoint(self) -> None:
        """Wait for a running checkpoint (its failure is logged, not raised)."""
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])

    async def _make_room(self, log_bytes: int) -> None:
        """Before a commit that may write ``log_bytes`` of log (a large session): truncate
        the file first if the commit could take it past M."""
        size = self._store.wal_size()
        self._wal.measured(size)
        if size and size + log_bytes >= self._wal.max_bytes:
            await self._truncate(size)

    async def _keep_wal_small(self) -> None:
        """After a commit that may have taken the log past a threshold: start a PASSIVE
        checkpoint, or truncate the log (see the module's text for when)."""
        size = self._store.wal_size()
        self._wal.measured(size)
        if size >= self._wal.truncate_at:
            await self._truncate(size)
        elif size > self._wal.checkpoint_at and self._checkpoint is None:
            self._start_checkpoint()

    async def _truncate(self, size: int) -> None:
        """Empty the log between two commits, once the checkpoint running ended."""
        if self._checkpoint is not None:  # one checkpoint at a time (SQLite's lock)
            await asyncio.wait([self._checkpoint])
        loop = asyncio.get_running_loop()
        try:
            done = await loop.run_in_executor(self._writer_exec, self._store.truncate_wal)
        except (sqlite3.Error, StoreError) as exc:
            done = False
            self._wal_warnings.warning("WAL truncation failed: %s", exc)
        self._wal.truncated(done, size)
        if not done:
            self._wal_warnings.warning(
                "WAL of %d bytes not truncated: readers on older snapshots did not end "
                "within %d tries of %d ms; trying again at %d bytes",
                size,
                TRUNCATE_ATTEMPTS,
                TRUNCATE_WAIT_MS,
                self._wal.truncate_at,
            )

    def _start_checkpoint(self) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._checkpoint_exec, self._store.checkpoint)
        self._checkpoint = future

        def done(f: asyncio.Future[bool]) -> None:
            self._checkpoint = None
            complete = not f.cancelled() and f.exception() is None and f.result()
            # all copied: the next commit restarts the log; else the size that is left
            self._wal.checkpointed(complete, 0 if complete else self._store.wal_size())
            if not f.cancelled() and f.exception() is not None:
                self._wal_warnings.warning("WAL checkpoint failed: %s", f.exception())

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

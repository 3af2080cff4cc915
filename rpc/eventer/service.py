"""What a started Eventer server runs: the store's threads, registrar, writer, fan-out and
queries, wired together. :meth:`Service.open` builds it once the database is open, so
nothing in it exists half-started.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import rpc
from rpc.eventer.codec import encode, register_event_to_sbs
from rpc.eventer.config import ServerConfig
from rpc.eventer.fanout import Fanout
from rpc.eventer.handlers import Handlers
from rpc.eventer.queries import Queries
from rpc.eventer.sessions import Registrar, Session, SessionFuture, TypeCatalog
from rpc.eventer.splice import split_register_req
from rpc.eventer.store import Store, StoreState
from rpc.eventer.values import (
    ENVELOPE_RESERVE,
    MAX_EVENT_GROWTH,
    MSG_REGISTER_REQ,
    EventPayloadJson,
    EventType,
    InvalidMessage,
    QueryParams,
    RegisterEvent,
    Status,
)
from rpc.eventer.writer import Writer
from rpc.tasks import TaskSet
from transports.logs import RateLimitedLog

log = logging.getLogger("peerwire.eventer.server")
refusals = RateLimitedLog(log)
"""Registrations refused for load: at most 20 lines per 10 s, however many clients send."""

MAX_PENDING_EVENTS = 500_000
"""Events waiting for their commit at most; past it registrations fail (bounded memory, with
``max_pending_bytes`` of them: see :meth:`Service.submit`)."""


@dataclass(frozen=True, slots=True)
class Threads:
    """The store's threads: one writer, one checkpointer, readers (the writer itself for a
    ``:memory:`` store, which has a single connection)."""

    writer: ThreadPoolExecutor
    checkpoint: ThreadPoolExecutor
    reader: ThreadPoolExecutor

    @classmethod
    def for_store(cls, store: Store) -> Threads:
        writer = ThreadPoolExecutor(1, thread_name_prefix="eventer-writer")
        return cls(
            writer=writer,
            checkpoint=ThreadPoolExecutor(1, thread_name_prefix="eventer-checkpoint"),
            reader=writer
            if store.single_connection
            else ThreadPoolExecutor(2, thread_name_prefix="eventer-reader"),
        )

    def shutdown(self) -> None:
        for executor in {self.writer, self.reader, self.checkpoint}:
            executor.shutdown(wait=False)


class Service:
    """A started server's state; :attr:`registry` serves its connections."""

    def __init__(
        self, config: ServerConfig, store: Store, state: StoreState, threads: Threads
    ) -> None:
        self.config = config
        self.server_id = config.server_id
        self.status = Status.OPERATIONAL
        self.closing = False
        """Set once :meth:`EventerServer.close` begins: no new clients, no DISCONNECTED."""
        self.tasks = TaskSet(asyncio.get_running_loop())
        self._store = store
        self._threads = threads
        # events of one message: its size less the envelope, an array count and a flag
        max_event_bytes = self._max_event_bytes = config.max_message_size - ENVELOPE_RESERVE - 11
        catalog = TypeCatalog(state.types)
        self.fanout = Fanout(config.server_id, config.max_client_backlog)
        self.registrar = Registrar(
            config.server_id,
            catalog,
            last_session=state.last_session,
            last_ts=state.last_ts or 0,
            max_event_bytes=max_event_bytes,
            max_message_size=config.max_message_size,
        )
        self.writer = Writer(
            store,
            catalog,
            inline_commits=config.sync == "normal",
            writer_exec=threads.writer,
            checkpoint_exec=threads.checkpoint,
            on_commit=self.fanout.notify,
            processed=state.last_session,
        )
        self.queries = Queries(
            store,
            catalog,
            threads.reader,
            max_results=config.max_query_results,
            max_bytes=max_event_bytes,
        )
        self.tasks.spawn(self.writer.run())
        self.registry: rpc.Registry = Handlers(self).registry

    @classmethod
    async def open(cls, config: ServerConfig, store: Store) -> Service:
        """Open the database (raises StoreError if it cannot be used) and start the writer."""
        threads = Threads.for_store(store)
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(threads.writer, store.open, config.server_id)
        except BaseException:
            threads.shutdown()
            raise
        return cls(config, store, state, threads)

    # --- registration ------------------------------------------------------------------

    def submit(
        self, data: bytes, future: SessionFuture | None, force: bool = False
    ) -> Session | None:
        """Turn a MsgRegisterReq into a queued session (None: refused by status or load).

        ``future`` (if given) gets the session's events once committed. Raises
        InvalidMessage for bytes that are not a valid MsgRegisterReq or hold a payload that
        is not JSON; nothing is registered then.

        Load: a registration that would make more than :data:`MAX_PENDING_EVENTS` events
        wait for their commit is refused, and so is every one while ``max_pending_bytes``
        of events wait (so at most that plus one registration's wait: registrations sent
        faster than the disk takes them fail, the answer of a request ``failure``, a
        notification dropped, rather than fill memory). Why not stop reading from the
        registrant: the core stops reading a connection only once ``max_concurrent``
        (1,024) of its handlers wait, each holding its message (up to
        ``max_message_size``), which bounds nothing useful.
        """
        if self.status is not Status.OPERATIONAL and not force:
            return None
        parts = split_register_req(data)
        writer = self.writer
        if (
            writer.pending_events + len(parts) > MAX_PENDING_EVENTS
            or writer.pending_bytes >= self.config.max_pending_bytes
        ):
            refusals.warning(
                "registration refused: %d events (%d bytes) wait for the disk",
                writer.pending_events,
                writer.pending_bytes,
            )
            return None
        session = self.registrar.session(parts, future)
        if session.rows:
            self.writer.push(session)
        return session

    def submit_request(self, data: bytes, force: bool = False) -> SessionFuture | None:
        """:meth:`submit` with a registrant waiting: the future of its answer (None:
        refused by status or load)."""
        future: SessionFuture = asyncio.get_running_loop().create_future()
        if self.submit(data, future, force) is None:
            return None
        return future

    async def register_system(self, suffix: EventType, status: str, force: bool = False) -> None:
        """Register ``event/<server id>/<suffix>`` with a JSON status; wait for its commit."""
        future = self.submit_request(self._system_event(suffix, status), force)
        if future is not None:
            await future

    def register_system_nowait(self, suffix: EventType, status: str) -> None:
        """Register a system event without waiting; one too large for a message (see
        :meth:`system_event_fits`) is logged, not raised (it runs in a close callback)."""
        try:
            self.submit(self._system_event(suffix, status), None)
        except InvalidMessage as exc:
            log.warning("system event %r not registered: %s", suffix, exc)

    def system_event_fits(self, suffix: EventType, status: str) -> bool:
        """True when ``event/<server id>/<suffix>`` with ``status`` fits in one message:
        a client's name goes into its CONNECTED and DISCONNECTED events."""
        data = self._system_event(suffix, status)
        return len(data) + MAX_EVENT_GROWTH <= self._max_event_bytes

    def _system_event(self, suffix: EventType, status: str) -> bytes:
        event = RegisterEvent(
            ("event", str(self.server_id), *suffix), None, EventPayloadJson(status)
        )
        return encode(MSG_REGISTER_REQ, [register_event_to_sbs(event)])

    # --- queries and status --------------------------------------------------------------

    async def query(self, params: QueryParams) -> tuple[list[bytes], bool]:
        """Wait for the sessions registered so far, then run the query."""
        await self.writer.wait_processed(self.registrar.last_session)
        return await self.queries.run(params)

    async def wait_committed(self) -> None:
        """Return once every session registered so far is committed (or failed)."""
        await self.writer.wait_processed(self.registrar.last_session)

    def set_status(self, status: Status) -> None:
        if status != self.status:
            self.status = status
            self.fanout.status(status)

    # --- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every task and the writer, then close the database (connections are
        closed by then)."""
        self.tasks.cancel_all()
        await self.tasks.wait()
        self.writer.stop()  # in case its task was cancelled before it ever ran
        await self.writer.wait_checkpoint()
        threads = self._threads
        # queries of cancelled handlers may still run on reader threads: let them end
        # before the database closes
        if threads.reader is not threads.writer:
            await asyncio.to_thread(threads.reader.shutdown, True)
        await asyncio.get_running_loop().run_in_executor(threads.writer, self._store.close)
        threads.shutdown()

"""Queries: ``latest``, ``timeseries`` and ``server`` on reader threads.

Every query sees only committed events (the caller first waits for the sessions
registered before it, so a client reads its own writes). Results are capped at
``max_query_results`` events and at ``max_bytes`` of them: ``timeseries`` and ``server``
results are cut (``more_follows``), a ``latest`` result that cannot fit raises
:class:`~rpc.eventer.store.ResultTooLarge`. A wildcard query's types are matched against the
type catalog once and the ids cached (bounded by :data:`PATTERN_CACHE_IDS` ids in all), a
large match on a reader thread rather than on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rpc.eventer.sessions import TypeCatalog
from rpc.eventer.store import Store, TimeseriesQuery
from rpc.eventer.subscription import Subscription, has_wildcards
from rpc.eventer.values import (
    EventType,
    InvalidMessage,
    Order,
    OrderBy,
    QueryLatestParams,
    QueryParams,
    QueryServerParams,
    QueryTimeseriesParams,
    Timestamp,
)

PATTERN_CACHE_IDS = 1_000_000
"""Type ids the wildcard pattern cache holds at most, over all its patterns (about 8 MiB:
the ids are the catalog's own int objects); the least recently used patterns go first,
and a pattern that matches more types than this is not cached (resolved on a reader
thread every time)."""
PATTERN_CACHE_SIZE = 1024
"""Patterns the cache holds at most."""
MAX_CACHED_PATTERN = 1024
"""Weight of the largest pattern (query type list) the cache keeps, counted as its
segments plus its characters, so that the keys too hold a bounded amount (about 1 KiB
each): a larger one is resolved every time."""
INLINE_SCAN_TYPES = 256
"""Catalog types a wildcard pattern is matched against on the event loop at most (about
60 us), and only while it matched at most 64 times as many (copied into the new result,
about 20 us); a pattern with more to do (a new one, or many types added since it was
cached) is resolved on a reader thread, so no pattern holds the loop up for long."""


class Queries:
    """Runs queries against ``store`` on ``reader_exec``."""

    def __init__(
        self,
        store: Store,
        catalog: TypeCatalog,
        reader_exec: ThreadPoolExecutor,
        *,
        max_results: int,
        max_bytes: int,
    ) -> None:
        self._store = store
        self._catalog = catalog
        self._exec = reader_exec
        self._cap = max_results
        self._max_bytes = max_bytes
        self._pattern_cache: dict[tuple[EventType, ...], tuple[int, list[int]]] = {}
        """Pattern -> (catalog types checked, the ids among them it matches), least
        recently used first."""
        self._cached_ids = 0

    @property
    def cached_ids(self) -> int:
        """Type ids the pattern cache holds (at most :data:`PATTERN_CACHE_IDS`)."""
        return self._cached_ids

    async def run(self, params: QueryParams) -> tuple[list[bytes], bool]:
        """The result's events' SBS bytes and whether more follow.

        Raises ValueError for a ``server`` query whose ``last_event_id`` names another
        server, ResultTooLarge for a latest result over ``max_bytes``.
        """
        loop = asyncio.get_running_loop()
        store, cap, max_bytes = self._store, self._cap, self._max_bytes
        if isinstance(params, QueryLatestParams):
            type_ids = await self._resolve_types(params.event_types)
            blobs = await loop.run_in_executor(self._exec, store.query_latest, type_ids, max_bytes)
            return blobs, False
        if isinstance(params, QueryTimeseriesParams):
            query = TimeseriesQuery(
                by_source=params.order_by is OrderBy.SOURCE_TIMESTAMP,
                descending=params.order is Order.DESCENDING,
                t_from=_bound_us(params.t_from, 0, 1_000_000),
                t_to=_bound_us(params.t_to, -1, 999_999),
                source_t_from=None if params.source_t_from is None else params.source_t_from.key(),
                source_t_to=None if params.source_t_to is None else params.source_t_to.key(),
                type_ids=await self._resolve_types(params.event_types),
                last_event_id=params.last_event_id,
                limit=_limit(params.max_results, cap),
                max_bytes=max_bytes,
            )
            return await loop.run_in_executor(self._exec, store.query_timeseries, query)
        if isinstance(params, QueryServerParams):
            last = params.last_event_id
            if last is not None and last.server != params.server_id:
                raise ValueError("invalid server id")
            return await loop.run_in_executor(
                self._exec,
                store.query_server,
                params.server_id,
                last,
                _limit(params.max_results, cap),
                max_bytes,
            )
        raise InvalidMessage(f"unsupported query {params!r}")

    async def _resolve_types(self, query_types: Sequence[EventType] | None) -> list[int] | None:
        """Type ids a query selects; None = every type. Raises ValueError for a query type
        that is not one (a ``*`` not last, too many segments)."""
        if query_types is None:
            return None
        sub = Subscription(query_types)
        if sub.matches_all:
            return None
        catalog = self._catalog
        if not has_wildcards(sub.query_types):
            ids = catalog.ids
            return [ids[t] for t in sub.query_types if t in ids]
        key = sub.query_types
        items = catalog.items
        stop = len(items)  # types numbered later belong to sessions the query did not wait for
        entry = self._pattern_cache.pop(key, None)
        checked, found = (0, []) if entry is None else entry
        if entry is not None:
            self._cached_ids -= len(found)
        if checked < stop:
            if stop - checked <= INLINE_SCAN_TYPES and len(found) <= 64 * INLINE_SCAN_TYPES:
                found = _extend(sub, found, items, checked, stop)
            else:
                loop = asyncio.get_running_loop()
                found = await loop.run_in_executor(
                    self._exec, _extend, sub, found, items, checked, stop
                )
                done = self._pattern_cache.pop(key, None)  # resolved meanwhile
                if done is not None:
                    self._cached_ids -= len(done[1])
        self._remember(key, stop, found)
        return found

    def _remember(self, key: tuple[EventType, ...], checked: int, found: list[int]) -> None:
        """Cache ``found`` for ``key`` (evicting the least recently used patterns past the
        bounds), unless the pattern or its result is too large to keep."""
        if len(found) > PATTERN_CACHE_IDS or _weight(key) > MAX_CACHED_PATTERN:
            return
        cache = self._pattern_cache
        while cache and (
            len(cache) >= PATTERN_CACHE_SIZE or self._cached_ids + len(found) > PATTERN_CACHE_IDS
        ):
            _, evicted = cache.pop(next(iter(cache)))
            self._cached_ids -= len(evicted)
        cache[key] = (checked, found)
        self._cached_ids += len(found)


def _extend(
    sub: Subscription, found: list[int], items: list[tuple[int, EventType]], start: int, stop: int
) -> list[int]:
    """``found`` plus the ids of ``items[start:stop]`` that ``sub`` matches, as a new list
    (a cached one is never changed: a reader thread may be using it). May run on a reader
    thread: the catalog only ever appends, so the slice is stable."""
    return found + [i for i, t in items[start:stop] if sub.matches(t)]


def _weight(key: tuple[EventType, ...]) -> int:
    return sum(len(t) + sum(map(len, t)) for t in key)


def _bound_us(t: Timestamp | None, lo: int, hi: int) -> int | None:
    """A bound on server timestamps (always 0 <= us < 1e6) in microseconds that selects what
    comparing (s, us) pairs selects, as the reference does, whatever the bound's ``us``:
    ``us`` is clamped to [0, 1e6] for a lower bound, to [-1, 1e6 - 1] for an upper one."""
    if t is None:
        return None
    return Timestamp(t.s, min(max(t.us, lo), hi)).to_us()


def _limit(requested: int | None, cap: int) -> int:
    if requested is None or requested >= cap:
        return cap
    return max(requested, 0)

"""Queries: ``latest``, ``timeseries`` and ``server`` on reader threads.

Every query sees only committed events (the caller first waits for the sessions
registered before it, so a client reads its own writes). Results are capped at
``max_query_results`` events and at ``max_bytes`` of them: ``timeseries`` and ``server``
results are cut (``more_follows``), a ``latest`` result that cannot fit raises
:class:`~rpc.eventer.store.ResultTooLarge`.
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

PATTERN_CACHE_SIZE = 1024
"""Wildcard query type sets whose matching type ids are remembered."""


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

    async def run(self, params: QueryParams) -> tuple[list[bytes], bool]:
        """The result's events' SBS bytes and whether more follow.

        Raises ValueError for a ``server`` query whose ``last_event_id`` names another
        server, ResultTooLarge for a latest result over ``max_bytes``.
        """
        loop = asyncio.get_running_loop()
        store, cap, max_bytes = self._store, self._cap, self._max_bytes
        if isinstance(params, QueryLatestParams):
            type_ids = self._resolve_types(params.event_types)
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
                type_ids=self._resolve_types(params.event_types),
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

    def _resolve_types(self, query_types: Sequence[EventType] | None) -> list[int] | None:
        """Type ids a query selects; None = every type."""
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
        checked, found = self._pattern_cache.pop(key, (0, []))
        if checked < len(items):
            found = found + [i for i, t in items[checked:] if sub.matches(t)]
        if len(self._pattern_cache) >= PATTERN_CACHE_SIZE:
            self._pattern_cache.pop(next(iter(self._pattern_cache)))
        self._pattern_cache[key] = (len(items), found)
        return found


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

"""The SQLite store: every query is an index range (no table scan, no sort), schema and
transaction rules."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from rpc.eventer.common import EventId
from rpc.eventer.store import MERGE_MAX_TYPES, Store, StoreError, TimeseriesQuery


def fill(store: Store, sessions: int = 30, types: int = 40) -> None:
    store.write([(i + 1, ("t", str(i))) for i in range(types)], [], [])
    for session in range(1, sessions + 1):
        rows = [
            (1, session, i, (session * 7 + i) % types + 1, session * 1000, session * 10 - i, b"e")
            for i in range(1, 6)
        ]
        latest = [(r[3], 1, session, r[2], r[4]) for r in rows]
        store.write([], rows, latest)


def plans(store: Store, run) -> list[str]:
    """The query plan of every statement ``run`` executes on the store's reader."""
    conn = store._reader()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        run()
    finally:
        conn.set_trace_callback(None)
    out = []
    for sql in statements:
        if sql.lstrip().upper().startswith("SELECT"):
            out.append(" | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql)))
    assert out
    return out


def full_scan(plan: str) -> bool:
    """A table scan that is not an ordered index walk, or a sort of all matches.
    ("SCAN events USING INDEX x" walks x in order and stops at the LIMIT.)"""
    return re.search(r"SCAN events(?! USING)", plan) is not None or "TEMP B-TREE" in plan


def query(**kwargs) -> TimeseriesQuery:
    values = dict(
        by_source=False,
        descending=True,
        t_from=None,
        t_to=None,
        source_t_from=None,
        source_t_to=None,
        type_ids=None,
        last_event_id=None,
        limit=10,
    )
    values.update(kwargs)
    return TimeseriesQuery(**values)


@pytest.fixture
def store(tmp_path: Path):
    store = Store(tmp_path / "s.db", sync="normal")
    store.open(1)
    fill(store)
    yield store
    store.close()


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"descending": False, "t_from": 5000, "t_to": 9000},
        {"by_source": True},
        {"by_source": True, "descending": False, "source_t_from": 30, "t_to": 20000},
        {"type_ids": [3]},
        {"type_ids": [3, 4, 9], "by_source": True, "last_event_id": EventId(1, 20, 2)},
        {"type_ids": list(range(1, MERGE_MAX_TYPES + 5))},
        {"last_event_id": EventId(1, 20, 2)},
        {"descending": False, "last_event_id": EventId(1, 3, 1), "t_from": 1000},
    ],
)
def test_timeseries_queries_walk_an_index(store: Store, params) -> None:
    q = query(**params)
    for plan in plans(store, lambda: store.query_timeseries(q)):
        assert "USING INDEX" in plan or "PRIMARY KEY" in plan, plan
        assert not full_scan(plan), plan


def test_latest_and_server_queries_walk_an_index(store: Store) -> None:
    runs = [
        lambda: store.query_latest(None),
        lambda: store.query_latest([1, 2]),
        lambda: store.query_server(1, None, 5),
        lambda: store.query_server(1, EventId(1, 10, 3), 5),
    ]
    for run in runs:
        for plan in plans(store, run):
            assert not full_scan(plan), plan
            assert "events USING" in plan or "PRIMARY KEY" in plan, plan


def test_results_follow_the_order(store: Store) -> None:
    blobs, more = store.query_server(1, EventId(1, 29, 4), 5)  # (29, 5), (30, 1..4)
    assert len(blobs) == 5 and more
    blobs, more = store.query_server(1, EventId(1, 29, 4), 6)
    assert len(blobs) == 6 and not more
    expected = sum(1 for s in range(1, 31) for i in range(1, 6) if (s * 7 + i) % 40 == 0)
    by_type, more = store.query_timeseries(query(type_ids=[1], limit=100))
    assert len(by_type) == expected and not more
    everything, more = store.query_timeseries(query(limit=1000))
    assert len(everything) == 150 and not more


def test_failed_write_leaves_nothing(store: Store) -> None:
    before = store.query_server(1, None, 1000)[0]
    duplicate = (1, 1, 1, 1, 1, None, b"dup")  # primary key already used
    new = (1, 99, 1, 1, 99_000, None, b"new")
    with pytest.raises(sqlite3.IntegrityError):
        store.write([(500, ("n",))], [new, duplicate], [])
    assert store.query_server(1, None, 1000)[0] == before
    store.write([(500, ("n",))], [new], [(500, 1, 99, 1, 99_000)])
    assert store.query_latest([500]) == [b"new"]


def test_latest_follows_natural_order_across_servers(tmp_path: Path) -> None:
    store = Store(tmp_path / "l.db")
    store.open(1)
    store.write([(1, ("x",))], [(1, 1, 1, 1, 5000, None, b"one")], [(1, 1, 1, 1, 5000)])
    older = (2, 1, 1, 1, 4000, None, b"older")  # another server, earlier timestamp
    store.write([], [older], [(1, 2, 1, 1, 4000)])
    assert store.query_latest([1]) == [b"one"]
    newer = (2, 2, 1, 1, 6000, None, b"newer")
    store.write([], [newer], [(1, 2, 2, 1, 6000)])
    assert store.query_latest([1]) == [b"newer"]
    store.close()


def test_reopen_and_schema_checks(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = Store(path)
    assert store.open(7).last_session == 0
    store.write([(1, ("a", "b"))], [(7, 4, 1, 1, 123, None, b"x")], [])
    store.close()
    store = Store(path)
    state = store.open(7)
    assert (state.types, state.last_session, state.last_ts) == ([(1, ("a", "b"))], 4, 123)
    store.close()

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE events (x)")
    with pytest.raises(StoreError, match="schema version 0"):
        Store(foreign).open(1)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path).open(1)
    (tmp_path / "text.db").write_text("not a database at all, just text" * 10)
    with pytest.raises(StoreError):
        Store(tmp_path / "text.db").open(1)
    with pytest.raises(ValueError, match="sync"):
        Store(path, sync="off")

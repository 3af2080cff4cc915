"""The SQLite store: every query is an index range (no table scan, no sort), schema and
transaction rules."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from rpc.eventer import common
from rpc.eventer.common import EventId, Timestamp
from rpc.eventer.store import (
    MERGE_MAX_TYPES,
    ResultTooLarge,
    Store,
    StoreError,
    TimeseriesQuery,
)

BIG = 1 << 30


def key(us: int) -> bytes:
    return Timestamp.from_us(us).key()


def fill(store: Store, sessions: int = 30, types: int = 40) -> None:
    store.write([(i + 1, ("t", str(i))) for i in range(types)], [], [])
    for session in range(1, sessions + 1):
        rows = [
            (
                1,
                session,
                i,
                (session * 7 + i) % types + 1,
                session * 1000,
                key(session * 10 - i),
                b"e",
            )
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
        max_bytes=BIG,
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
        {"by_source": True, "descending": False, "source_t_from": key(30), "t_to": 20000},
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
        lambda: store.query_latest(None, BIG),
        lambda: store.query_latest([1, 2], BIG),
        lambda: store.query_server(1, None, 5, BIG),
        lambda: store.query_server(1, EventId(1, 10, 3), 5, BIG),
    ]
    for run in runs:
        for plan in plans(store, run):
            assert not full_scan(plan), plan
            assert "events USING" in plan or "PRIMARY KEY" in plan, plan


def test_results_follow_the_order(store: Store) -> None:
    blobs, more = store.query_server(1, EventId(1, 29, 4), 5, BIG)  # (29, 5), (30, 1..4)
    assert len(blobs) == 5 and more
    blobs, more = store.query_server(1, EventId(1, 29, 4), 6, BIG)
    assert len(blobs) == 6 and not more
    expected = sum(1 for s in range(1, 31) for i in range(1, 6) if (s * 7 + i) % 40 == 0)
    by_type, more = store.query_timeseries(query(type_ids=[1], limit=100))
    assert len(by_type) == expected and not more
    everything, more = store.query_timeseries(query(limit=1000))
    assert len(everything) == 150 and not more


def test_results_are_cut_by_size(store: Store) -> None:
    """Each blob is 1 byte: max_bytes cuts like a count would; a latest result that does
    not fit raises, as does a first event larger than max_bytes."""
    blobs, more = store.query_server(1, None, 100, 7)
    assert len(blobs) == 7 and more
    for params in ({}, {"type_ids": [1, 2, 3]}, {"type_ids": list(range(1, 41))}):
        blobs, more = store.query_timeseries(query(limit=100, max_bytes=3, **params))
        assert len(blobs) == 3 and more
        everything, _ = store.query_timeseries(query(limit=100, **params))
        assert blobs == everything[:3]
    assert len(store.query_latest(None, 40)) == 40
    with pytest.raises(ResultTooLarge, match="latest result holds more than 39 bytes"):
        store.query_latest(None, 39)
    with pytest.raises(ResultTooLarge, match="an event of 1 bytes"):
        store.query_server(1, None, 100, 0)


def test_source_timestamps_keep_their_order_beyond_int64_microseconds(tmp_path: Path) -> None:
    """s = +-2**62 used to clamp to the same microsecond; the key keeps (s, us) order."""
    store = Store(tmp_path / "k.db")
    store.open(1)
    stamps = [(2**62, 5), (2**62, 3), (-(2**62), 0), (2**62 + 1, -7), (0, 0), (-(2**63), 1)]
    rows = [(1, 1, i, 1, 1000, Timestamp(*t).key(), bytes([i])) for i, t in enumerate(stamps, 1)]
    store.write([(1, ("k",))], rows, [])
    ordered, _ = store.query_timeseries(query(by_source=True, descending=False, limit=10))
    expected = sorted(range(1, len(stamps) + 1), key=lambda i: stamps[i - 1])
    assert ordered == [bytes([i]) for i in expected]
    lo, hi = Timestamp(2**62, 4).key(), Timestamp(2**62 + 1, -7).key()
    window, _ = store.query_timeseries(
        query(by_source=True, descending=False, source_t_from=lo, source_t_to=hi)
    )
    assert window == [bytes([1]), bytes([4])]
    store.close()


def test_version_1_database_is_migrated(tmp_path: Path) -> None:
    """A version 1 file (integer, clamped source_ts) gets exact keys from the stored bytes."""
    path = tmp_path / "v1.db"
    stamps = [Timestamp(2**62, 1), Timestamp(2**62, 0), None]
    with sqlite3.connect(path) as conn:
        conn.executescript(
            "CREATE TABLE event_types (id INTEGER PRIMARY KEY, type TEXT NOT NULL UNIQUE);"
            "CREATE TABLE events (server INTEGER NOT NULL, session INTEGER NOT NULL,"
            " instance INTEGER NOT NULL, type_id INTEGER NOT NULL, ts INTEGER NOT NULL,"
            " source_ts INTEGER, data BLOB NOT NULL, PRIMARY KEY (server, session, instance))"
            " WITHOUT ROWID;"
            "CREATE INDEX events_source_ts ON events (source_ts) WHERE source_ts IS NOT NULL;"
            "INSERT INTO event_types VALUES (1, '[\"m\"]');"
            "PRAGMA user_version = 1;"
        )
        for i, stamp in enumerate(stamps, 1):
            event = common.Event(EventId(1, 1, i), ("m",), Timestamp(10, 0), stamp, None)
            data = common.encode("HatEventer.Event", common.event_to_sbs(event))
            clamped = None if stamp is None else stamp.to_us()
            conn.execute(
                "INSERT INTO events VALUES (1, 1, ?, 1, 10000000, ?, ?)", (i, clamped, data)
            )
    store = Store(path)
    assert store.open(1).last_session == 1
    ordered, _ = store.query_timeseries(query(by_source=True, descending=False))
    decoded = [common.event_from_sbs(common.decode("HatEventer.Event", b)) for b in ordered]
    assert [e.source_timestamp for e in decoded] == [stamps[1], stamps[0]]
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2


def test_failed_write_leaves_nothing(store: Store) -> None:
    before = store.query_server(1, None, 1000, BIG)[0]
    duplicate = (1, 1, 1, 1, 1, None, b"dup")  # primary key already used
    new = (1, 99, 1, 1, 99_000, None, b"new")
    with pytest.raises(sqlite3.IntegrityError):
        store.write([(500, ("n",))], [new, duplicate], [])
    assert store.query_server(1, None, 1000, BIG)[0] == before
    store.write([(500, ("n",))], [new], [(500, 1, 99, 1, 99_000)])
    assert store.query_latest([500], BIG) == [b"new"]


def test_latest_follows_natural_order_across_servers(tmp_path: Path) -> None:
    store = Store(tmp_path / "l.db")
    store.open(1)
    store.write([(1, ("x",))], [(1, 1, 1, 1, 5000, None, b"one")], [(1, 1, 1, 1, 5000)])
    older = (2, 1, 1, 1, 4000, None, b"older")  # another server, earlier timestamp
    store.write([], [older], [(1, 2, 1, 1, 4000)])
    assert store.query_latest([1], BIG) == [b"one"]
    newer = (2, 2, 1, 1, 6000, None, b"newer")
    store.write([], [newer], [(1, 2, 2, 1, 6000)])
    assert store.query_latest([1], BIG) == [b"newer"]
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

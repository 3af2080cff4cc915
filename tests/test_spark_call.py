"""rpc.spark.call / call_frame from a local[2] session against real peerwire servers on
127.0.0.1 (Gotalk and both Chatter dialects): results, per-row errors, exactly one call per
row, typed results, timeouts, a peer that is down, a peer that drops connections, retry
results, reconnecting after the pooled connection died, and TLS."""

from __future__ import annotations

import asyncio
import errno
import json
import socket
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import rpc
from rpc import spark as pws
from tests.certs import Pki
from tests.spark_session import (  # noqa: F401
    FLAVOURS,
    ONE_SPARK_AT_A_TIME,
    loop_thread_fixture,
    serve_peer_fixture,
    spark_fixture,
)
from transports.stream import server_ssl_context

pytestmark = ONE_SPARK_AT_A_TIME


@dataclass
class Person:
    id: int
    name: str


def people(session: SparkSession, n: int) -> DataFrame:
    """``id`` 0..n-1 and ``name`` "n<id>", over two partitions (both Python workers)."""
    return session.range(0, n, numPartitions=2).withColumn(
        "name", F.concat(F.lit("n"), F.col("id").cast("string"))
    )


def people_registry(calls: Counter[Any]) -> rpc.Registry:
    registry = rpc.Registry()

    @registry.handle("greet")
    def greet(name: str) -> dict[str, str]:
        calls["greet", name] += 1
        return {"greeting": f"Hello {name}"}

    @registry.handle("check")
    def check(person: Person) -> int:
        calls["check", person.id] += 1
        if person.id % 7 == 0:
            raise ValueError(f"{person.id} is unlucky")
        return person.id * 2

    return registry


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_results_errors_and_one_call_per_row(spark: SparkSession, serve_peer, flavour) -> None:
    calls: Counter[Any] = Counter()
    url = serve_peer(flavour, people_registry(calls)).url
    n = 300
    df = people(spark, n)

    rows = df.select(
        "id",
        pws.call(url, "greet", "name").alias("g"),
        pws.call(url, "check", "id", "name", result_type="long").alias("c"),
    ).collect()

    assert len(rows) == n
    for row in rows:
        assert row.g.error is None
        assert json.loads(row.g.result) == {"greeting": f"Hello n{row.id}"}
        if row.id % 7 == 0:
            assert (row.c.result, row.c.error) == (None, f"RemoteError: {row.id} is unlucky")
        else:
            assert (row.c.result, row.c.error) == (row.id * 2, None)
    expected = Counter({("greet", f"n{i}"): 1 for i in range(n)})
    expected.update({("check", i): 1 for i in range(n)})
    assert calls == expected

    # a filter on the result and two projections of it: still one call per row (a
    # deterministic UDF would be evaluated again for the filter)
    calls.clear()
    kept = (
        df.withColumn("c", pws.call(url, "check", "id", "name", result_type="long"))
        .where(F.col("c.error").isNull())
        .select("id", F.col("c.result").alias("twice"), (F.col("c.result") + 1).alias("plus"))
        .collect()
    )
    assert sorted(r.id for r in kept) == [i for i in range(n) if i % 7]
    assert all(r.twice == 2 * r.id and r.plus == 2 * r.id + 1 for r in kept)
    assert calls == Counter({("check", i): 1 for i in range(n)})


def test_typed_results_in_a_frame(spark: SparkSession, serve_peer) -> None:
    registry = rpc.Registry()

    @registry.handle("describe")
    def describe(person: Person) -> dict[str, Any]:
        if person.id == 3:
            return {"name": person.name, "length": "many"}
        return {"name": person.name.upper(), "length": len(person.name)}

    url = serve_peer("chatter", registry).url
    out = pws.call_frame(
        people(spark, 40),
        url,
        "describe",
        "id",
        "name",
        into="info",
        result_type="name string, length int",
    )
    assert out.columns == ["id", "name", "info"]
    assert out.schema["info"].dataType.simpleString() == (
        "struct<result:struct<name:string,length:int>,error:string>"
    )
    rows = {r.id: r for r in out.collect()}
    assert len(rows) == 40
    assert rows[3].info.result is None
    assert rows[3].info.error.startswith("TypeError: result {'name': 'n3', 'length': 'many'}")
    assert "does not fit struct<name:string,length:int>" in rows[3].info.error
    for i in set(rows) - {3}:
        assert rows[i].name == f"n{i}"
        assert rows[i].info.error is None
        assert rows[i].info.result.asDict() == {"name": f"N{i}", "length": len(f"n{i}")}


def test_options_object_and_keywords_are_the_same(spark: SparkSession, serve_peer) -> None:
    """``options=pws.CallOptions(...)``, its fields as keywords, or both (keywords win)."""
    registry = rpc.Registry()

    @registry.handle("twice")
    def twice(n: int) -> int:
        return 2 * n

    url = serve_peer("gotalk", registry).url
    df = spark.range(0, 6, numPartitions=2)
    typed = pws.CallOptions(result_type="long", timeout=5.0, max_in_flight=2)
    rows = df.select(
        "id",
        pws.call(url, "twice", "id", options=typed).alias("o"),
        pws.call(url, "twice", "id", result_type="long", timeout=5.0, max_in_flight=2).alias("k"),
        pws.call(url, "twice", "id", options=typed, result_type=None).alias("j"),
    ).collect()
    assert sorted((r.id, r.o.result, r.k.result, r.j.result) for r in rows) == [
        (i, 2 * i, 2 * i, str(2 * i)) for i in range(6)
    ]
    out = pws.call_frame(df, url, "twice", "id", options=typed)
    assert out.columns == ["id", "rpc"]
    assert sorted(r.rpc.result for r in out.collect()) == [2 * i for i in range(6)]

    with pytest.raises(TypeError, match="max_concurrency"):
        pws.call(url, "twice", "id", max_concurrency=2)  # an apply option, not a call one
    with pytest.raises(TypeError, match="into= is for call_frame"):
        pws.call(url, "twice", "id", into="x")
    with pytest.raises(ValueError, match="max_in_flight"):
        pws.call(url, "twice", "id", options=typed, max_in_flight=0)
    with pytest.raises(ValueError, match="must not be negative"):
        pws.CallOptions(retries=-1)


def test_per_call_timeout_and_raise_mode(spark: SparkSession, serve_peer) -> None:
    registry = rpc.Registry()

    @registry.handle("slow")
    async def slow(n: int) -> int:
        if n % 10 == 0:
            await asyncio.sleep(2.0)  # work past the call's 0.3-s timeout (not a wait)
        return n

    url = serve_peer("chatter", registry).url
    df = spark.range(0, 40, numPartitions=2)
    rows = df.select("id", pws.call(url, "slow", "id", timeout=0.3).alias("r")).collect()
    for row in rows:
        if row.id % 10 == 0:
            assert row.r.result is None
            assert row.r.error == "RequestTimeout: slow: no result within 0.3 s"
        else:
            assert (row.r.result, row.r.error) == (str(row.id), None)

    # the failed row is named by its request value, or by the key column the caller names
    with pytest.raises(Exception, match=r"call 'slow' failed for request \d*0: RequestTimeout"):
        df.select(pws.call(url, "slow", "id", timeout=0.3, on_error="raise")).collect()
    keyed = df.withColumn("key", F.concat(F.lit("k"), F.col("id").cast("string")))
    with pytest.raises(Exception, match=r"call 'slow' failed for key='k\d*0': RequestTimeout"):
        keyed.select(
            pws.call(url, "slow", "id", timeout=0.3, on_error="raise", key="key")
        ).collect()
    # with on_error="null" a key column changes nothing but travels along
    rows = keyed.select("id", pws.call(url, "slow", "id", key="key").alias("r")).collect()
    assert sorted((r.id, r.r.result) for r in rows if r.id % 10) == [
        (i, str(i)) for i in range(40) if i % 10
    ]


def test_request_shapes_null_results_and_udf_names(spark: SparkSession, serve_peer, capsys) -> None:
    registry = rpc.Registry()

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @registry.handle("nothing")
    def nothing(value: Any) -> None:
        return None

    url = serve_peer("gotalk", registry).url
    df = people(spark, 20)
    out = df.select(
        "id",
        pws.call(url, "echo", "name").alias("bare"),
        pws.call(url, "echo", "name", request="object").alias("obj"),
        pws.call(url, "echo", "id", "name").alias("two"),
        pws.call(url, "nothing", "id").alias("null"),
        pws.call(url, "nothing", "id", result_type="long").alias("typed_null"),
    )
    for row in out.collect():
        assert json.loads(row.bare.result) == f"n{row.id}"
        assert json.loads(row.obj.result) == {"name": f"n{row.id}"}
        assert json.loads(row.two.result) == {"id": row.id, "name": f"n{row.id}"}
        # a null result is SQL NULL, with or without result_type, and not an error
        assert (row.null.result, row.null.error) == (None, None)
        assert (row.typed_null.result, row.typed_null.error) == (None, None)
    with pytest.raises(ValueError, match='request="value" takes exactly one column'):
        pws.call(url, "echo", "id", "name", request="value")

    # plans (and the UI) name each UDF after its op
    capsys.readouterr()
    out.explain()
    plan = capsys.readouterr().out
    assert "peerwire_call_echo" in plan and "peerwire_call_nothing" in plan
    pws.call_frame(df, url, "echo", "name").explain()
    assert "peerwire_call_echo" in capsys.readouterr().out


def test_peer_that_is_down(spark: SparkSession) -> None:
    """Rows wait ``retry_for`` seconds for the peer, then fail naming the cause; rows after
    that fail at once (the job does not wait ``retry_for`` per row)."""
    url = f"tcp+gotalk://127.0.0.1:{free_port()}"
    started = time.monotonic()
    rows = (
        people(spark, 2000)
        .select(
            pws.call(url, "greet", "name", retry_for=1.0).alias("once"),
            pws.call(url, "greet", "name", idempotent=True, retry_for=1.0).alias("r"),
        )
        .collect()
    )
    elapsed = time.monotonic() - started
    assert len(rows) == 2000
    for row in rows:
        for outcome in (row.once, row.r):
            assert outcome.result is None
            assert outcome.error.startswith(f"ConnectionClosed: cannot connect to {url}: ")
            assert f"[Errno {errno.ECONNREFUSED}]" in outcome.error  # either loop's wording
    assert 1.0 <= elapsed < 30  # waited once per Python worker and outage, not per row


def dropping_registry(
    processed: Counter[int], every: int, drops: list[int] | None = None
) -> rpc.Registry:
    """``work`` aborts the connection at every ``every``-th request it receives on it; that
    request and any after it on the dying connection are not processed. ``drops`` counts
    the aborts (one entry each)."""
    registry = rpc.Registry()

    @registry.handle("work")
    def work(n: int) -> int:
        peer = rpc.current_peer.get()
        if not peer.is_open:
            return -1  # the connection is closing: the reply cannot be sent anyway
        seen = peer.state["seen"] = peer.state.get("seen", 0) + 1
        if seen % every == 0:
            peer.abort()
            if drops is not None:
                drops.append(n)
            return -1
        processed[n] += 1
        return n * 3

    return registry


@pytest.mark.parametrize("flavour", ["gotalk", "chatter"])
def test_peer_that_drops_connections_mid_job(spark: SparkSession, serve_peer, flavour) -> None:
    processed: Counter[int] = Counter()
    drops: list[int] = []
    served = serve_peer(flavour, dropping_registry(processed, every=150, drops=drops))
    n = 1000
    df = spark.range(0, n, numPartitions=2)

    rows = df.select("id", pws.call(served.url, "work", "id").alias("r")).collect()
    ok = {r.id for r in rows if r.r.error is None}
    failed = [r for r in rows if r.r.error is not None]
    assert len(rows) == n
    assert failed, "the server dropped connections: some calls must have failed"
    lost = f"ConnectionClosed: connection to {served.url} lost with the call in flight"
    assert {r.r.error for r in failed} == {lost}  # one wording for one event
    # only calls in flight fail: per drop, at most the in-flight window (128) of each of
    # the 2 partitions (their tasks may share one Python worker's connection); the rest
    # waited for the reconnect
    assert len(failed) <= 128 * 2 * len(drops)
    assert all(r.r.result == str(r.id * 3) for r in rows if r.id in ok)
    assert all(processed[i] == 1 for i in ok)  # no retries: nothing ran twice
    assert max(processed.values()) == 1

    processed.clear()
    before = served.connections
    rows = df.select(
        "id", pws.call(served.url, "work", "id", idempotent=True, backoff=0.05)
    ).collect()
    assert sorted((r.id, r.work.result, r.work.error) for r in rows) == [
        (i, str(i * 3), None) for i in range(n)
    ]
    assert set(processed) == set(range(n))
    assert served.connections - before > 2  # it reconnected after the drops


def test_retry_results_are_honoured_for_any_op(spark: SparkSession, serve_peer) -> None:
    """A retry result means the peer did not run the request: it is sent again for any op
    (within retry_for, or ``retries`` times)."""
    processed: Counter[int] = Counter()
    registry = rpc.Registry()

    @registry.handle("limited")
    async def limited(n: int) -> int:
        processed[n] += 1
        await asyncio.sleep(0.005)  # the handler's work: it holds its slot (not a wait)
        return -n

    # two requests at a time per connection; the rest get retry results
    options = rpc.Options(max_concurrent=2, retry_wait=0.01)
    url = serve_peer("gotalk", registry, options=options).url
    df = spark.range(0, 200, numPartitions=2)

    rows = df.select(
        "id", pws.call(url, "limited", "id", max_in_flight=16, retries=0).alias("r")
    ).collect()
    refused = [r for r in rows if r.r.error is not None]
    assert refused and all(r.r.error == "RetryLater: request rate limit" for r in refused)
    assert all(processed[r.id] == 0 for r in refused)

    processed.clear()
    stats = pws.CallStats(spark)
    rows = df.select(
        "id",
        pws.call(url, "limited", "id", max_in_flight=16, backoff=0.01, stats=stats).alias("r"),
    ).collect()
    assert sorted((r.id, r.r.result, r.r.error) for r in rows) == [
        (i, str(-i), None) for i in range(200)
    ]
    assert processed == Counter(range(200))  # refused requests never ran: once per row
    counts = stats.value["peerwire_call_limited"]
    assert (counts["calls"], counts["errors"]) == (200, 0)
    assert counts["retries"] > 0


def test_reconnects_when_the_pooled_connection_died(spark: SparkSession, serve_peer) -> None:
    calls: Counter[Any] = Counter()
    served = serve_peer("gotalk", people_registry(calls))
    df = people(spark, 200)

    def greetings() -> list[tuple[Any, ...]]:
        rows = df.select("id", pws.call(served.url, "greet", "name").alias("g")).collect()
        return sorted((r.id, r.g.error) for r in rows)

    assert greetings() == [(i, None) for i in range(200)]
    first = served.connections
    served.drop_connections()  # the Python workers keep their (now dead) connections
    # not idempotent, so nothing is retried: every row succeeds only if the dead
    # connection is noticed and replaced before any request is sent on it
    assert greetings() == [(i, None) for i in range(200)]
    assert served.connections > first
    assert calls == Counter({("greet", f"n{i}"): 2 for i in range(200)})


@pytest.mark.parametrize("flavour", ["gotalk", "chatter"])
def test_tls(spark: SparkSession, serve_peer, pki: Pki, flavour: str) -> None:
    calls: Counter[Any] = Counter()
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    url = serve_peer(flavour, people_registry(calls), tls=True, ssl=ctx).url
    assert url.startswith("ssl+")
    rows = (
        people(spark, 50)
        .select("id", pws.call(url, "greet", "name", tls=pws.Tls(cafile=str(pki.ca))).alias("g"))
        .collect()
    )
    assert sorted((r.id, r.g.result) for r in rows) == [
        (i, json.dumps({"greeting": f"Hello n{i}"}, separators=(",", ":"))) for i in range(50)
    ]

    # a CA that did not sign the server's certificate: every row fails, the job does not,
    # and the rows do not wait out retry_for (30 s) first: a TLS refusal is not an outage
    started = time.monotonic()
    rows = (
        people(spark, 10)
        .select(pws.call(url, "greet", "name", tls=pws.Tls(cafile=str(pki.other_ca))).alias("g"))
        .collect()
    )
    assert all("CERTIFICATE_VERIFY_FAILED" in r.g.error for r in rows)
    assert time.monotonic() - started < 20

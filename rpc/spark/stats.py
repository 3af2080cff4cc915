"""Counts of rows called, failed and resent, per UDF, summed over a job's tasks.

    stats = pws.CallStats(spark)
    df.select(pws.call(url, "greet", "name", stats=stats)).collect()
    stats.value  # {"peerwire_call_greet": {"calls": 1000, "errors": 3, "retries": 5}}

A Spark accumulator, so it needs a classic session (Spark Connect has none) and counts what
successful tasks did: a failed task's counts are dropped, a re-run task's counted again.
"""

from __future__ import annotations

from typing import Any

from pyspark.accumulators import AccumulatorParam

from rpc.spark.worker import Tally

Counts = dict[str, dict[str, int]]


class _CountsParam(AccumulatorParam[Counts]):
    def zero(self, value: Counts) -> Counts:
        return {}

    def addInPlace(self, value1: Counts, value2: Counts) -> Counts:
        for name, counts in value2.items():
            mine = value1.setdefault(name, {"calls": 0, "errors": 0, "retries": 0})
            for field, n in counts.items():
                mine[field] = mine.get(field, 0) + n
        return value1


class CallStats:
    """Rows called, failed and resent per UDF (``peerwire_call_<op>``,
    ``peerwire_apply_<op>``), read on the driver after an action."""

    def __init__(self, spark: Any) -> None:
        try:
            context = spark.sparkContext
        except AttributeError as exc:  # Spark Connect: no SparkContext, no accumulators
            raise TypeError(
                "CallStats needs a classic Spark session (accumulators do not exist on "
                "Spark Connect); count the error column instead"
            ) from exc
        self._accumulator = context.accumulator({}, _CountsParam())

    @property
    def value(self) -> Counts:
        """Counts so far (on the driver)."""
        return {name: dict(counts) for name, counts in self._accumulator.value.items()}

    def add(self, name: str, tally: Tally) -> None:
        """Add one task's counts (on an executor)."""
        counts = {"calls": tally.calls, "errors": tally.errors, "retries": tally.retries}
        self._accumulator.add({name: counts})

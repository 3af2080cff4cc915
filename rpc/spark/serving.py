"""Serving mode: a peerwire op whose requests are answered by Spark jobs, in batches.

    batcher = SparkBatcher(spark, score_job, "name string, x double", result="score")
    serve_op(registry, "score", batcher)
    async with rpc.serve("tcp+gotalk://0.0.0.0:4000", registry=registry) as server: ...

Every request is one row (an object with the schema's fields). Requests that arrive while a
job runs wait for the next one, so under load each Spark job answers many requests and the
work is spread over the executors; when idle, a request waits at most ``max_wait`` for
company. One job runs at a time per batcher, for at most ``job_timeout``: a job still
running then is cancelled (its Spark job group, interrupting its tasks), its batch's
requests fail with a timeout error and the next batch runs, so one stuck job does not
wedge the op.

The job gets a DataFrame of the batch's rows plus a ``__peerwire_row`` column and must
return a DataFrame with one row per input row that keeps ``__peerwire_row`` (any
row-wise transformation does, including :func:`rpc.spark.apply_frame`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DataType, LongType, StructField, StructType

from rpc.registry import Registry
from rpc.spark.frames import parse_type

log = logging.getLogger("peerwire.spark")

ROW_ID = "__peerwire_row"

Job = Callable[[DataFrame], DataFrame]

_groups = itertools.count(1)


class JobTimeout(TimeoutError):
    """A batch's Spark job ran past ``job_timeout`` and was cancelled."""


class SparkBatcher:
    """Collects requests and answers each batch with one Spark job (lives on one loop)."""

    def __init__(
        self,
        spark: SparkSession,
        job: Job,
        schema: StructType | str,
        *,
        result: str | None = None,
        max_batch: int = 10_000,
        max_wait: float = 0.005,
        max_pending: int = 100_000,
        job_timeout: float = 300.0,
    ) -> None:
        """``schema``: the request's fields (a StructType or DDL string such as
        ``"name string, x double"``). ``result``: the job's output column that is the
        answer; None answers with an object of all output columns. Past ``max_pending``
        waiting requests, new ones get an error result at once (bounded memory). A job
        running longer than ``job_timeout`` seconds (default 300) is cancelled and its
        batch's requests fail with a timeout error; the next batch's job starts at once."""
        if not job_timeout > 0:
            raise ValueError(f"job_timeout must be positive: {job_timeout!r}")
        if max_batch < 1 or max_pending < 1:  # a batch of none would never let the loop go
            raise ValueError(
                f"max_batch and max_pending must be at least 1: {max_batch}, {max_pending}"
            )
        if not max_wait >= 0:
            raise ValueError(f"max_wait must not be negative: {max_wait!r}")
        parsed: DataType | None = parse_type(schema)
        if not isinstance(parsed, StructType):
            raise TypeError(f"schema must describe a struct (the request's fields): {schema!r}")
        if ROW_ID in parsed.fieldNames():
            raise ValueError(f"{ROW_ID} is reserved")
        self.spark = spark
        self.job = job
        self.schema = parsed
        self.result = result
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_pending = max_pending
        self.job_timeout = job_timeout
        try:
            self._context: SparkContext | None = spark.sparkContext
        except Exception:  # Spark Connect has no SparkContext: its jobs are tagged instead
            self._context = None
        self._fields = parsed.fieldNames()
        with_row = StructType([*parsed.fields, StructField(ROW_ID, LongType(), False)])
        row_type = to_arrow_type(with_row, timezone="UTC")
        self._arrow_schema = pa.schema([row_type.field(i) for i in range(row_type.num_fields)])
        self._queue: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.jobs = 0
        """Spark jobs run so far."""
        self.answered = 0
        """Requests answered so far."""
        self.timeouts = 0
        """Jobs cancelled at ``job_timeout`` so far."""

    async def submit(self, params: Any) -> Any:
        """Queue one request; returns its result once its batch's job has run."""
        if not isinstance(params, dict):
            raise ValueError(f"a request is an object with fields {self._fields}")
        unknown = set(params) - set(self._fields)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; expected {self._fields}")
        if len(self._queue) >= self.max_pending:
            raise RuntimeError("too many requests waiting for Spark; try again later")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((params, future))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
            self._runner.add_done_callback(self._runner_done)
        return await future

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        """A runner that died of a bug must not leave requests waiting forever."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("spark batcher failed", exc_info=task.exception())
        queue, self._queue = self._queue, []
        for _, future in queue:
            if not future.done():
                future.set_exception(RuntimeError("the Spark batcher failed; see server log"))

    async def _run(self) -> None:
        try:
            while self._queue:
                if len(self._queue) < self.max_batch and self.max_wait > 0:
                    await asyncio.sleep(self.max_wait)  # let a burst gather
                batch = [item for item in self._queue[: self.max_batch] if not item[1].done()]
                del self._queue[: self.max_batch]
                if not batch:
                    continue
                try:
                    outcomes = await self._bounded_job([p for p, _ in batch])
                except JobTimeout as exc:
                    outcomes = [(None, str(exc))] * len(batch)
                except Exception as exc:
                    log.warning("spark job for %d requests failed", len(batch), exc_info=True)
                    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    outcomes = [(None, f"Spark job failed: {type(exc).__name__}: {message}")]
                    outcomes *= len(batch)
                for (_, future), (value, error) in zip(batch, outcomes, strict=True):
                    if future.done():  # the requester went away
                        continue
                    if error is None:
                        future.set_result(value)
                    else:
                        future.set_exception(RuntimeError(error))
                    self.answered += 1
        finally:
            self._runner = None

    async def _bounded_job(self, values: list[dict[str, Any]]) -> list[tuple[Any, str | None]]:
        """Run the batch's job in a thread of its own for at most ``job_timeout``, then
        cancel it and raise :class:`JobTimeout`. Its thread is not waited for (a cancelled
        Spark job ends its action at once; a job stuck outside Spark cannot be stopped),
        and its late outcome is dropped."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[tuple[Any, str | None]]] = loop.create_future()
        group = f"peerwire-serving-{next(_groups)}"

        def settle(outcome: Any, error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(outcome)
            else:
                done.set_exception(error)

        def run() -> None:
            try:
                outcome, error = self._run_job(values, group), None
            except Exception as exc:  # handed to the loop, raised there
                outcome, error = None, exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, outcome, error)

        threading.Thread(target=run, name=group, daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.job_timeout)
        except TimeoutError:
            self.timeouts += 1
            log.warning(
                "spark job for %d requests still running after %g s: cancelled",
                len(values),
                self.job_timeout,
            )
            try:
                await asyncio.to_thread(self._cancel, group)
            except Exception:
                log.warning("cancelling spark job group %s failed", group, exc_info=True)
            raise JobTimeout(
                f"Spark job timed out after {self.job_timeout:g} s (cancelled)"
            ) from None
        finally:
            done.cancel()  # settled already, or the thread's late outcome is dropped

    def _cancel(self, group: str) -> None:
        if self._context is not None:
            self._context.cancelJobGroup(group)
        else:
            self.spark.interruptTag(group)

    def _rows(self, values: list[dict[str, Any]]) -> tuple[pa.Table, list[str | None]]:
        """The batch as an Arrow table; rows that do not fit the schema are left out and
        get an error."""
        rows = [{**v, ROW_ID: i} for i, v in enumerate(values)]
        errors: list[str | None] = [None] * len(rows)
        try:
            return pa.Table.from_pylist(rows, schema=self._arrow_schema), errors
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            good = []
            for i, row in enumerate(rows):
                try:
                    pa.Table.from_pylist([row], schema=self._arrow_schema)
                    good.append(row)
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    errors[i] = f"request does not fit {self.schema.simpleString()}: {exc}"
            return pa.Table.from_pylist(good, schema=self._arrow_schema), errors

    def _run_job(self, values: list[dict[str, Any]], group: str) -> list[tuple[Any, str | None]]:
        """The batch's job, on this thread under job group (or tag) ``group``, which
        :meth:`_cancel` cancels."""
        table, errors = self._rows(values)
        outcomes: list[tuple[Any, str | None]] = [(None, e) for e in errors]
        if table.num_rows == 0:
            return outcomes
        if self._context is not None:
            self._context.setJobGroup(group, "peerwire serving batch", interruptOnCancel=True)
        else:
            self.spark.addTag(group)
        try:
            output = self.job(self.spark.createDataFrame(table)).toArrow()
        finally:
            if self._context is None:
                self.spark.removeTag(group)
        self.jobs += 1
        if ROW_ID not in output.column_names:
            raise ValueError(f"the job's output lost the {ROW_ID} column")
        names = [n for n in output.column_names if n != ROW_ID]
        if self.result is not None and self.result not in names:
            raise ValueError(f"the job's output has no column {self.result!r}: {names}")
        seen = set()
        for row in output.to_pylist(maps_as_pydicts="lossy"):
            i = row.pop(ROW_ID)
            if i in seen:
                continue
            seen.add(i)
            outcomes[i] = (row[self.result] if self.result is not None else row), None
        for i, (_, error) in enumerate(outcomes):
            if error is None and i not in seen:
                outcomes[i] = (None, "the Spark job returned no row for this request")
        return outcomes


def serve_op(registry: Registry, op: str, batcher: SparkBatcher) -> None:
    """Register ``op`` on ``registry``: each request goes through ``batcher``."""

    async def handler(params: Any) -> Any:
        return await batcher.submit(params)

    handler.__name__ = handler.__qualname__ = f"spark_{op}"
    registry.handle(op)(handler)

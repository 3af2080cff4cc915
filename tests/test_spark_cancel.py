"""A row whose coroutine ends in CancelledError (a future another task cancelled, a gather
with a cancelled child) while its worker is not being cancelled: that row gets the error
and its batch resolves (it used to end the worker task, and the batch never resolved, so
a Spark task waited forever); closing a pipeline still ends its workers. In this process,
on the worker runtime, without Spark."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest
from pyspark import cloudpickle

from rpc.spark.apply import LocalHandler
from rpc.spark.worker import Outcome, Pipeline, runtime
from tests.rpc_helpers import wait_until


async def cancelled_elsewhere() -> None:
    """Await a future another party cancelled: CancelledError in a task nobody cancelled."""
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(future.cancel)
    await future


async def cancelled_child() -> None:
    """gather() with a child that was cancelled: CancelledError in the gathering task."""
    child = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_soon(child.cancel)
    await asyncio.gather(child)


async def doubled(value: int) -> Outcome:
    if value == 3:
        await cancelled_elsewhere()
    return value * 2, None


def test_a_row_cancelled_inside_fn_gets_the_error_and_the_batch_resolves() -> None:
    pipe = Pipeline(runtime(), doubled, window=4)
    try:
        results, errors = pipe.submit(list(range(6))).result(2)
        assert results == [0, 2, 4, None, 8, 10]
        assert errors == [None, None, None, "CancelledError", None, None]
        assert (pipe.tally.calls, pipe.tally.errors) == (6, 1)
        # the workers live on: the next batch runs too
        assert pipe.submit([3, 4]).result(2) == ([None, 8], ["CancelledError", None])
    finally:
        pipe.close()


def test_closing_still_cancels_the_workers_and_their_rows() -> None:
    started = asyncio.Event()

    async def stuck(value: int) -> Outcome:
        started.set()
        await asyncio.Event().wait()
        return value, None

    pipe = Pipeline(runtime(), stuck, window=2)
    batch = pipe.submit([1, 2])
    runtime().run(asyncio.wait_for(started.wait(), 2))
    pipe.close()
    with pytest.raises(concurrent.futures.CancelledError):
        batch.result(2)
    runtime().run(wait_until(lambda: not pipe._workers, timeout=2))


async def handler(n: int) -> int:
    if n == 3:
        await cancelled_child()
    if n == 4:
        await cancelled_elsewhere()
    return n + 1


def test_an_apply_handler_ending_in_cancelled_error_is_that_rows_error() -> None:
    source = cloudpickle.dumps((handler, int))
    batches: Any = LocalHandler("inc", source, max_concurrency=4, typed=False).open()
    try:
        results, errors = batches.submit(list(range(6))).result(2)
    finally:
        batches.close()
    assert results == [1, 2, 3, None, None, 6]
    assert errors == [None, None, None, "CancelledError", "CancelledError", None]

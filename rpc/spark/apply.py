"""Running a registry's handlers over a DataFrame, on the executors, without a network.

    results = pws.apply_frame(requests, handlers.registry, "score", "features")

The handler gets each row's value exactly as it would get a remote request's parameters
(validated against its first parameter's annotation), so one handler serves both a peerwire
server and a Spark job. Synchronous handlers run inline in the UDF; coroutine handlers (and
async generators, whose parts are collected into a list) are run on the worker's event loop,
``max_concurrency`` at a time.

How the handler's code reaches the executors:

- pass the :class:`rpc.Registry`: the handler function is pickled with the UDF
  (cloudpickle). Functions of ``__main__``, notebooks and nested functions travel by value;
  functions of an importable module travel by reference and that module must be installed
  on the executors, unless :func:`ship_by_value` registered it to travel by value;
- pass ``"package.module:attribute"``: the module is imported on the executors (and on
  the driver, to check the op), so it must be installed there.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import importlib
import inspect
import io
import pickle
import types
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame

from rpc.chatter_payloads import Reply
from rpc.payload import PayloadError, convert
from rpc.registry import Handler, HandlerKind, Registry
from rpc.spark.frames import (
    ResultShape,
    column_function,
    input_column,
    map_frame,
    parse_type,
    udf_name,
)
from rpc.spark.options import ApplyOptions
from rpc.spark.worker import (
    Outcome,
    Pipeline,
    Results,
    Tally,
    describe,
    runtime,
)
from rpc.tasks import being_cancelled

# types Arrow converts itself: kept as they are when a typed result is made builtin
_ARROW_NATIVE = (
    bytes,
    bytearray,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
)


def ship_by_value(module: types.ModuleType) -> None:
    """Send ``module``'s functions to executors by value (for handler modules that are not
    installed there). Call it on the driver before building the DataFrame."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)


_MSGSPEC_CACHE = "__msgspec_cache__"


class _HandlerPickler(cloudpickle.Pickler):
    """cloudpickle without msgspec's type-info caches.

    msgspec stores a ``__msgspec_cache__`` attribute on every dataclass, TypedDict and
    NamedTuple it has decoded (as the registry does for a handler's parameter type); those
    caches cannot be pickled, so a class that travels by value (one of ``__main__``, a
    notebook, a function, or a ``ship_by_value`` module) would fail to pickle. The class's
    pickled state leaves the cache out; msgspec rebuilds it on the executor.
    """

    def reducer_override(self, obj: Any) -> Any:
        # cloudpickle's Pickler is untyped
        reduced = super().reducer_override(obj)  # type: ignore[no-untyped-call]
        if not isinstance(obj, type) or _MSGSPEC_CACHE not in vars(obj):
            return reduced
        # a class pickled by value: (make skeleton, args, (class dict, slot state), ...)
        if isinstance(reduced, tuple) and len(reduced) > 2 and isinstance(reduced[2], tuple):
            class_dict, *rest = reduced[2]
            if isinstance(class_dict, dict) and _MSGSPEC_CACHE in class_dict:
                class_dict = {k: v for k, v in class_dict.items() if k != _MSGSPEC_CACHE}
                return (*reduced[:2], (class_dict, *rest), *reduced[3:])
        return reduced


def _pickled(value: Any) -> bytes:
    buffer = io.BytesIO()
    # cloudpickle's Pickler is untyped: the constructor is its own, called on our subclass
    pickler: cloudpickle.Pickler = _HandlerPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)  # type: ignore[no-untyped-call]
    pickler.dump(value)
    return buffer.getvalue()


def resolve(handlers: Registry | str, op: str) -> Handler:
    """The handler of ``op`` in a registry or a ``"module:attribute"`` registry path."""
    registry = handlers
    if isinstance(handlers, str):
        module_name, _, attribute = handlers.partition(":")
        registry = getattr(importlib.import_module(module_name), attribute or "registry")
    if not isinstance(registry, Registry):
        raise TypeError(f"{handlers!r} is not an rpc.Registry")
    handler = registry.get(op)
    if handler is None:
        raise ValueError(f"no handler for {op!r}; the registry has {registry.names()}")
    if handler.kind is not HandlerKind.REQUEST:
        raise ValueError(f"{op!r} takes a stream request; apply() runs request handlers only")
    return handler


@dataclass(frozen=True, slots=True)
class LocalHandler:
    """The evaluator of :func:`apply`: the handler itself, or where to import it from."""

    op: str
    source: bytes | str
    """The handler function and its parameter type (resolved on the driver, where its names
    are), pickled by _HandlerPickler; or a ``"module:attribute"`` path to import on the
    executor instead."""
    max_concurrency: int
    typed: bool

    def handler(self) -> Handler:
        if isinstance(self.source, str):
            return resolve(self.source, self.op)
        fn, annotation = pickle.loads(self.source)
        return Handler.of(self.op, fn, HandlerKind.REQUEST, annotation)  # decoder built here

    def open(self) -> _HandlerBatches:
        return _HandlerBatches(self.handler(), self.max_concurrency, self.typed)


class _Done:
    """A batch computed inline: already complete."""

    __slots__ = ("_results",)

    def __init__(self, results: Results) -> None:
        self._results = results

    def result(self) -> Results:
        return self._results


class _HandlerBatches:
    def __init__(self, handler: Handler, max_concurrency: int, typed: bool) -> None:
        self.handler = handler
        self.typed = typed
        self.tally = Tally()
        self._pipeline: Pipeline | None = None
        if handler.is_async:
            self._pipeline = Pipeline(runtime(), self._run_async, max_concurrency, self.tally)

    def submit(self, values: list[Any]) -> Any:
        if self._pipeline is not None:
            return self._pipeline.submit(values)
        results: list[Any] = []
        errors: list[str | None] = []
        for value in values:
            result, error = self._run_sync(value)
            results.append(result)
            errors.append(error)
        self.tally.calls += len(values)
        self.tally.errors += sum(e is not None for e in errors)
        return _Done((results, errors))

    def close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()

    def _params(self, value: Any) -> Any:
        annotation = self.handler.annotation
        if annotation is bytes:
            if not isinstance(value, bytes | bytearray):
                raise PayloadError(f"invalid parameters: expected bytes, got {type(value)}")
            return bytes(value)
        return convert(value, annotation)

    def _finish(self, result: Any) -> Any:
        if isinstance(result, Reply):
            result = result.value
        if self.typed:
            return msgspec.to_builtins(result, builtin_types=_ARROW_NATIVE)
        return result

    def _run_sync(self, value: Any) -> Outcome:
        try:
            result = self.handler.fn(self._params(value))
            if inspect.isawaitable(result):  # a plain function that returned a coroutine
                result = runtime().run(_awaited(result))
            return self._finish(result), None
        except Exception as exc:
            return None, describe(exc)

    async def _run_async(self, value: Any) -> Outcome:
        try:
            result = self.handler.fn(self._params(value))
            if inspect.isasyncgen(result):
                result = [part async for part in result]
            elif inspect.isawaitable(result):
                result = await result
            return self._finish(result), None
        except asyncio.CancelledError as exc:
            if being_cancelled():
                raise
            return None, describe(exc)  # the handler's own, as any error of it
        except Exception as exc:
            return None, describe(exc)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _setup(
    handlers: Registry | str, op: str, options: ApplyOptions
) -> tuple[LocalHandler, ResultShape]:
    handler = resolve(handlers, op)
    spark_type = parse_type(options.result_type)
    typed = spark_type is not None
    if isinstance(handlers, str):
        source: bytes | str = handlers
    else:
        source = _pickled((handler.fn, handler.annotation))  # unpicklable handlers fail here
    evaluator = LocalHandler(op, source, options.max_concurrency, typed)
    shape = ResultShape(spark_type, options.on_error, what=f"handler {op!r}", key=options.key)
    return evaluator, shape


def apply(
    handlers: Registry | str,
    op: str,
    *cols: Column | str,
    options: ApplyOptions | None = None,
    **keywords: Any,
) -> Column:
    """A ``struct<result, error>`` column: ``op``'s handler run on each row's value.

    Options are an :class:`~rpc.spark.options.ApplyOptions` or its fields as keywords.
    Values, ``result_type``, ``request``, ``on_error``, ``key`` and ``stats`` as in
    :func:`rpc.spark.call`; ``handlers`` is a :class:`rpc.Registry` or a
    ``"module:attribute"`` path to one. Coroutine handlers run on the worker loop, at most
    ``max_concurrency`` (default 64) at once per Python worker. ``into`` is for
    :func:`apply_frame` only.
    """
    if "into" in keywords:
        raise TypeError("apply() names its column after the op: into= is for apply_frame()")
    o = ApplyOptions.of(options, keywords)
    evaluator, shape = _setup(handlers, op, o)
    source = input_column(cols, o.request, o.key)
    return column_function(evaluator, shape, source, udf_name("apply", op), o.stats).alias(op)


def apply_frame(
    df: DataFrame,
    handlers: Registry | str,
    op: str,
    *cols: Column | str,
    options: ApplyOptions | None = None,
    **keywords: Any,
) -> DataFrame:
    """``df`` with a ``struct<result, error>`` column ``into`` (default ``"rpc"``, as
    :func:`~rpc.spark.call_frame`'s) from running ``op``'s handler over every row
    (``mapInArrow``; every other column kept). Options as in :func:`apply`."""
    o = ApplyOptions.of(options, keywords)
    evaluator, shape = _setup(handlers, op, o)
    source = input_column(cols, o.request, o.key)
    return map_frame(df, source, o.into, evaluator, shape, udf_name("apply", op), o.stats)

"""The Spark side shared by :func:`rpc.spark.call` and :func:`rpc.spark.apply`.

Both turn a column of request values into a ``struct<result, error>`` column, batch by
batch, through an :class:`Evaluator` (remote calls or local handlers). Two front-ends:

- :func:`column_function`: an Arrow iterator UDF (``Iterator[pa.Array] ->
  Iterator[pa.Array]``), marked non-deterministic so the optimizer never evaluates it twice
  for a row (a deterministic UDF may be duplicated into a filter or a projection);
- :func:`map_frame`: ``mapInArrow`` over the whole frame, keeping every other column.

A batch is handed to the evaluator, and the next one is read from Spark while the first is
in flight (one batch ahead), so the connection never idles between Arrow batches. Both are
named after what they run (``peerwire_call_greet``), so plans and the UI tell them apart;
an optional :class:`rpc.spark.CallStats` gets each task's counts when it ends.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DataType, StringType, StructField, StructType

from rpc.errors import RpcError
from rpc.spark.stats import CallStats
from rpc.spark.worker import Results, Tally

ON_ERROR = ("null", "raise")
PREFETCH = 1
"""Batches read ahead of the one being answered."""
INPUT_COLUMN = "__peerwire_input"

_json = msgspec.json.Encoder()
_T = TypeVar("_T")
_O = TypeVar("_O")


class SparkCallError(RpcError):
    """A row failed and the caller asked for ``on_error="raise"``: the Spark task fails."""


class Pending(Protocol):
    def result(self) -> Results: ...


class Batches(Protocol):
    """An evaluation in progress (one per Spark partition)."""

    tally: Tally

    def submit(self, values: list[Any]) -> Pending: ...
    def close(self) -> None: ...


class Evaluator(Protocol):
    """Picklable: travels to executors inside the UDF and opens one :class:`Batches` per
    partition there."""

    def open(self) -> Batches: ...


# --- results -----------------------------------------------------------------------------


def parse_type(result_type: DataType | str | None) -> DataType | None:
    """A DDL string (``"double"``, ``"label string, score double"``) or a DataType; DDL
    strings are parsed by the active session (classic or Connect)."""
    if result_type is None or isinstance(result_type, DataType):
        return result_type
    return DataType.fromDDL(result_type)


@functools.lru_cache(maxsize=64)
def _arrow_type(spark_type: DataType) -> pa.DataType:
    return to_arrow_type(spark_type, timezone="UTC")


@dataclass(frozen=True, slots=True)
class ResultShape:
    """How a batch's results become the ``struct<result, error>`` column.

    ``result_type`` None: every result is its JSON text (a string column). Otherwise the
    values are converted to that Spark type; a value that does not fit makes its row an
    error, not the batch.
    """

    result_type: DataType | None = None
    on_error: str = "null"
    what: str = "call"
    key: str | None = None
    """The column that names a failed row in ``on_error="raise"`` errors (None: the
    request value does)."""

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")

    @property
    def struct_type(self) -> StructType:
        return StructType(
            [
                StructField("result", self.result_type or StringType(), True),
                StructField("error", StringType(), True),
            ]
        )

    def build(
        self, results: list[Any], errors: list[str | None], labels: Sequence[Any]
    ) -> pa.StructArray:
        """The column for one batch; ``labels`` name its rows (key or request values)."""
        if self.on_error == "raise":
            for label, error in zip(labels, errors, strict=True):
                if error is not None:
                    row = f"request {label!r:.200}" if self.key is None else f"{self.key}={label!r}"
                    raise SparkCallError(f"{self.what} failed for {row}: {error}")
        if self.result_type is None:
            target = pa.string()
            values = _json_texts(results, errors)
        else:
            target = _arrow_type(self.result_type)
            values = [None if e is not None else r for r, e in zip(results, errors, strict=True)]
        try:
            column = pa.array(values, type=target)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            column = _fit_rows(values, errors, target, self.result_type)
        return pa.StructArray.from_arrays(
            [column, pa.array(errors, type=pa.string())],
            fields=[pa.field("result", target), pa.field("error", pa.string())],
        )


def _json_texts(results: list[Any], errors: list[str | None]) -> list[str | None]:
    texts: list[str | None] = []
    for i, (result, error) in enumerate(zip(results, errors, strict=True)):
        if error is not None or result is None:  # a null result is SQL NULL, not 'null'
            texts.append(None)
            continue
        try:
            texts.append(_json.encode(result).decode())
        except (TypeError, msgspec.EncodeError) as exc:
            texts.append(None)
            errors[i] = f"PayloadError: result is not JSON-able: {exc}"
    return texts


def _fit_rows(
    values: list[Any], errors: list[str | None], target: pa.DataType, spark_type: DataType | None
) -> pa.Array:
    """The slow path after a batch did not convert: find the rows that do not fit."""
    name = spark_type.simpleString() if spark_type is not None else "string"
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            pa.array([value], type=target)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            values[i] = None
            errors[i] = f"TypeError: result {value!r:.100} does not fit {name}: {exc}"
    return pa.array(values, type=target)


# --- evaluation --------------------------------------------------------------------------


def stream(
    evaluator: Evaluator,
    shape: ResultShape,
    items: Iterator[_T],
    values_of: Callable[[_T], tuple[list[Any], Sequence[Any]]],
    emit: Callable[[_T, pa.StructArray], _O],
    name: str,
    stats: CallStats | None,
) -> Iterator[_O]:
    """Evaluate every item's values, one batch ahead, and emit results in input order;
    ``values_of`` gives an item's request values and the labels that name its rows."""
    batches = evaluator.open()
    pending: deque[tuple[_T, Sequence[Any], Pending]] = deque()
    try:
        for item in items:
            values, labels = values_of(item)
            pending.append((item, labels, batches.submit(values)))
            if len(pending) > PREFETCH:
                first, first_labels, handle = pending.popleft()
                yield emit(first, shape.build(*handle.result(), first_labels))
        while pending:
            first, first_labels, handle = pending.popleft()
            yield emit(first, shape.build(*handle.result(), first_labels))
    finally:
        batches.close()
        if stats is not None:
            stats.add(name, batches.tally)


def to_values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Arrow values as JSON-able Python values (maps as dicts; structs as dicts)."""
    values: list[Any] = array.to_pylist(maps_as_pydicts="lossy")
    return values


REQUEST_SHAPES = ("value", "object")
_KEYED = ("__request", "__key")


@dataclass(frozen=True, slots=True)
class Input:
    """The UDF's input column (driver only) and how executors read it."""

    column: Column
    reader: Reader


@dataclass(frozen=True, slots=True)
class Reader:
    """Reads request values and the labels that name rows from the input column (travels
    to executors)."""

    keyed: bool

    def values(self, array: pa.Array | pa.ChunkedArray) -> tuple[list[Any], Sequence[Any]]:
        if not self.keyed:
            values = to_values(array)
            return values, values
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not isinstance(array, pa.StructArray):
            raise TypeError(f"expected the (request, key) struct, got {array.type}")
        return to_values(array.field(0)), array.field(1).to_pylist()


def input_column(
    cols: Sequence[Column | str], request: str | None = None, key: str | None = None
) -> Input:
    """The request column: one column's value, or an object keyed by the columns' names
    (or aliases) when several are given; ``request="value"`` or ``"object"`` fixes the
    shape. With a ``key`` column, its value travels along to name failed rows."""
    if not cols:
        raise ValueError("give at least one input column")
    if request is not None and request not in REQUEST_SHAPES:
        raise ValueError(f"request must be one of {REQUEST_SHAPES} or None, not {request!r}")
    columns = [F.col(c) if isinstance(c, str) else c for c in cols]
    if request == "value" and len(columns) > 1:
        raise ValueError('request="value" takes exactly one column; use request="object"')
    as_object = request == "object" or len(columns) > 1
    column = F.struct(*columns) if as_object else columns[0]
    if key is None:
        return Input(column, Reader(keyed=False))
    keyed = F.struct(column.alias(_KEYED[0]), F.col(key).alias(_KEYED[1]))
    return Input(keyed, Reader(keyed=True))


def udf_name(kind: str, op: str) -> str:
    """The name plans and the UI show: ``peerwire_call_greet``."""
    return f"peerwire_{kind}_{re.sub(r'[^0-9A-Za-z_]', '_', op)}"


def column_function(
    evaluator: Evaluator, shape: ResultShape, source: Input, name: str, stats: CallStats | None
) -> Column:
    """A non-deterministic Arrow iterator UDF named ``name``: input -> ``struct<result,
    error>``."""

    reader = source.reader

    def evaluate(arrays: Iterator[pa.Array]) -> Iterator[pa.Array]:
        return stream(evaluator, shape, arrays, reader.values, _result_only, name, stats)

    evaluate.__name__ = evaluate.__qualname__ = name
    # the type hints make it an iterator UDF: a form pyspark's overloads do not describe
    udf = F.arrow_udf(evaluate, shape.struct_type)  # type: ignore[call-overload]
    return udf.asNondeterministic()(source.column)  # type: ignore[no-any-return]


def _result_only(_: Any, result: pa.StructArray) -> pa.StructArray:
    return result


def map_frame(
    df: DataFrame,
    source: Input,
    into: str,
    evaluator: Evaluator,
    shape: ResultShape,
    name: str,
    stats: CallStats | None,
) -> DataFrame:
    """``df`` with one more column, ``into``, evaluated by ``mapInArrow`` (a function
    named ``name``)."""
    if into in df.columns:
        raise ValueError(f"the frame already has a column {into!r}; pick another into=")
    schema = StructType([*df.schema.fields, StructField(into, shape.struct_type, True)])
    names = [*df.columns, into]

    def emit(batch: pa.RecordBatch, result: pa.StructArray) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([*batch.columns[:-1], result], names=names)

    reader = source.reader

    def values_of(batch: pa.RecordBatch) -> tuple[list[Any], Sequence[Any]]:
        return reader.values(batch.column(batch.num_columns - 1))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return stream(evaluator, shape, batches, values_of, emit, name, stats)

    run.__name__ = run.__qualname__ = name
    return df.withColumn(INPUT_COLUMN, source.column).mapInArrow(run, schema)

"""Grouped writes on Spark (the twin of ``datahub.engines.ray.export``): ``mapInArrow`` tasks read and route rows,
then either ``groupBy(key).applyInArrow`` writes each group in one Python worker, all its rows at once
(``write_groups``), or the rows are repartitioned by key and sorted within partitions (Spark's sort spills to disk)
and a ``mapInArrow`` task streams each group's batches, in order, to the sink (``write_sorted``: a task holds a
batch, not a group). Both return the tasks' small result rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from datahub.engines.base import Engine
from datahub.engines.sink import RESULT, Sink, WriteTask, task_results
from datahub.engines.spark.engine import SparkEngine
from datahub.engines.spark.jobs import jobs_ended_on_exit
from datahub.engines.spark.quiet import map_in_arrow, pandas_notice_ignored

R = TypeVar("R")


def _spark_type(field: pa.Field) -> pa.Field:
    """Spark's Arrow batches carry 32-bit offsets: large binary/string travel as binary/string."""
    if pa.types.is_large_binary(field.type):
        return pa.field(field.name, pa.binary())
    if pa.types.is_large_string(field.type):
        return pa.field(field.name, pa.string())
    return field


@dataclass(frozen=True)
class _Read:
    tasks: tuple[Any, ...]
    read: Callable[[Any], Iterator[pa.Table]]
    spark_schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for table in self.read(self.tasks[index]):
                    yield from table.cast(self.spark_schema).to_batches()


@dataclass(frozen=True)
class _Write:
    task: WriteTask[Any]
    routed_schema: pa.Schema

    def __call__(self, group: pa.Table) -> pa.Table:
        return self.task(group.cast(self.routed_schema))


def _routed(engine: Engine, tasks: Sequence[Any], read: Callable[[Any], Iterator[pa.Table]],
            routed_schema: pa.Schema) -> tuple[Any, Any]:
    """The engine's session and a DataFrame of ``read(task)``'s rows for every task (one read partition per task)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if not isinstance(engine, SparkEngine):
        raise TypeError(f"datahub.engines.spark.export needs a SparkEngine, got {type(engine).__name__}")
    session = engine.session
    spark_schema = pa.schema([_spark_type(f) for f in routed_schema])
    index = session.sparkContext.parallelize([(i,) for i in range(len(tasks))], numSlices=len(tasks))
    routed = map_in_arrow(session.createDataFrame(index, "task long"), _Read(tuple(tasks), read, spark_schema),
                          from_arrow_schema(spark_schema))
    return session, routed


def write_groups(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 sink: Sink[R, Any], routed_schema: pa.Schema, workers: int | None = None) -> list[R]:
    """See ``datahub.engines.ray.export.write_groups``; ``workers`` sets the number of write partitions."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if not tasks:
        return []
    session, routed = _routed(engine, tasks, read, routed_schema)
    if workers:
        routed = routed.repartition(workers, key)
    writer = _Write(WriteTask(sink), routed_schema)

    def write_group(group: pa.Table) -> pa.Table:  # a plain function: Spark reads its arity (a key argument or not)
        return writer(group)

    with pandas_notice_ignored():
        written = routed.groupBy(key).applyInArrow(write_group, from_arrow_schema(RESULT))
    with jobs_ended_on_exit(session):  # a failed task: its job's other tasks end before the caller cleans up
        return task_results(written.toArrow())


SIGN_BIT = -(2**63)  # XOR with it orders int64 bits (Spark's signed longs) as the uint64 they hold


@dataclass(frozen=True)
class _WriteSorted:
    """A ``mapInArrow`` task over a partition sorted by key: every key's rows, batch by batch, to the sink's
    ``write`` (one lazy iterable per key, pulled from the partition's stream as the sink asks); one RESULT row per
    key."""

    task: WriteTask[Any]
    key: str
    routed_schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        groups = _KeyedPieces(self._pieces(batches))
        while groups.head is not None:
            value = groups.head[0]
            result = self.task.over(groups.of(value))
            groups.skip(value)  # what the sink left of its group (none, for a sink that reads its batches)
            yield from result.to_batches()

    def _pieces(self, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.Table]]:
        for batch in batches:
            if not batch.num_rows:
                continue
            table = pa.Table.from_batches([batch]).cast(self.routed_schema)
            keys = np.asarray(table.column(self.key).combine_chunks(), dtype=np.int64)
            cuts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)]
            for begin, end in zip(cuts[:-1], cuts[1:]):
                yield int(keys[begin]), table.slice(begin, end - begin)


class _KeyedPieces:
    """A stream of (key, rows) pieces, sorted by key, read one key's pieces at a time."""

    def __init__(self, pieces: Iterator[tuple[int, pa.Table]]) -> None:
        self._pieces = pieces
        self.head: tuple[int, pa.Table] | None = next(pieces, None)

    def of(self, value: int) -> Iterable[pa.Table]:
        while self.head is not None and self.head[0] == value:
            rows = self.head[1]
            self.head = next(self._pieces, None)
            yield rows

    def skip(self, value: int) -> None:
        for _ in self.of(value):
            pass


def write_sorted(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 order: Sequence[str], sink: Sink[R, Any], routed_schema: pa.Schema, unsigned: Sequence[str] = (),
                 workers: int | None = None) -> list[R]:
    """Run ``read(task)`` for every task (Arrow tables of ``routed_schema`` with an int64 ``key`` column), then the
    sink's ``write`` once per key value with its rows in batches, sorted by ``order`` (columns; those in
    ``unsigned``, int64 columns, compared as the uint64 their bits hold; strings by their bytes) and in order from
    batch to batch; return the tasks' results for the caller's ``sink.commit``. ``workers``: write partitions
    (default: Spark's shuffle partitions). A task holds one Arrow batch of its rows (Spark's
    ``spark.sql.execution.arrow.maxRecordsPerBatch``), never a group: the shuffle and the sort spill to disk."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    if not tasks:
        return []
    session, routed = _routed(engine, tasks, read, routed_schema)
    routed = routed.repartition(workers, key) if workers else routed.repartition(key)
    columns = [F.col(key)] + [F.col(name).bitwiseXOR(F.lit(SIGN_BIT)) if name in unsigned else F.col(name)
                              for name in order]
    ordered = routed.sortWithinPartitions(*columns)
    written = map_in_arrow(ordered, _WriteSorted(WriteTask(sink), key, routed_schema), from_arrow_schema(RESULT))
    with jobs_ended_on_exit(session):  # a failed task: its job's other tasks end before the caller cleans up
        return task_results(written.toArrow())

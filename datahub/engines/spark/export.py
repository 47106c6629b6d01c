"""Grouped writes on Spark: ``mapInArrow`` tasks read and route rows, ``groupBy(key).applyInArrow`` writes each
group in one Python worker and returns its small result rows (the twin of ``datahub.engines.ray.export``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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


def write_groups(engine: Engine, tasks: Sequence[Any], *, read: Callable[[Any], Iterator[pa.Table]], key: str,
                 sink: Sink[R, Any], routed_schema: pa.Schema, workers: int | None = None) -> list[R]:
    """See ``datahub.engines.ray.export.write_groups``; ``workers`` sets the number of write partitions."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if not tasks:
        return []
    if not isinstance(engine, SparkEngine):
        raise TypeError(f"datahub.engines.spark.export needs a SparkEngine, got {type(engine).__name__}")
    session = engine.session
    spark_schema = pa.schema([_spark_type(f) for f in routed_schema])
    index = session.sparkContext.parallelize([(i,) for i in range(len(tasks))], numSlices=len(tasks))
    routed = map_in_arrow(session.createDataFrame(index, "task long"), _Read(tuple(tasks), read, spark_schema),
                          from_arrow_schema(spark_schema))
    if workers:
        routed = routed.repartition(workers, key)
    writer = _Write(WriteTask(sink), routed_schema)

    def write_group(group: pa.Table) -> pa.Table:  # a plain function: Spark reads its arity (a key argument or not)
        return writer(group)

    with pandas_notice_ignored():
        written = routed.groupBy(key).applyInArrow(write_group, from_arrow_schema(RESULT))
    with jobs_ended_on_exit(session):  # a failed task: its job's other tasks end before the caller cleans up
        return task_results(written.toArrow())

"""Typed Spark DataFrames from per-file Arrow reads (QA validates them with Great Expectations' Spark engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datahub.engines.base import Engine
from datahub.engines.spark.arrow import spark_name, spark_schema, spark_side_schema
from datahub.engines.spark.quiet import map_in_arrow


@dataclass(frozen=True)
class _ReadTyped:
    """An index of files -> the rows ``read`` yields for each, as Spark-compatible Arrow batches of ``schema``."""

    read: Callable[[Any], Iterator[pa.Table]]
    files: tuple[Any, ...]
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        target = spark_side_schema(self.schema)
        for batch in batches:
            for index in batch.column("index").to_pylist():
                for table in self.read(self.files[index]):
                    table = table.select(self.schema.names).rename_columns([spark_name(n) for n in self.schema.names])
                    yield from table.cast(target).to_batches()


def read_dataframe(engine: Engine, files: Sequence[Any], read: Callable[[Any], Iterator[pa.Table]],
                   schema: pa.Schema) -> Any:
    """A ``pyspark.sql.DataFrame`` of the rows ``read(file)`` yields (tables of ``schema``), one Spark task per
    file; nothing is collected on the driver."""
    session = engine.session  # type: ignore[attr-defined]
    index = session.sparkContext.parallelize([(i,) for i in range(len(files))], numSlices=max(1, len(files)))
    return map_in_arrow(session.createDataFrame(index, "index long"), _ReadTyped(read, tuple(files), schema),
                        spark_schema(schema))

"""Spark's tasks writing Parquet files (``datahub.lake.files``) into a Delta table's folder, and running
a sink's writes (``datahub.engines.sink``); the driver commits them (add actions)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datahub.engines.sink import WriteTask
from datahub.engines.spark.arrow import decode, from_spark_side, ipc_blobs
from datahub.lake.files import WRITTEN, ParquetTarget, write_file

WRITTEN_DDL = "uri string, size long, rows long, stats string"


def described(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=WRITTEN)


@dataclass(frozen=True)
class WriteParquet:
    """One partition -> one Parquet file of ``target``; yields its description (no row if empty).

    Input: IPC blobs (``encoded``) or typed Spark rows (e.g. after a sort).
    """

    target: ParquetTarget
    encoded: bool = True

    def _tables(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
        for batch in batches:
            if self.encoded:
                yield from (decode(blob) for blob in ipc_blobs(batch))
            else:
                yield from_spark_side(pa.Table.from_batches([batch]))

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        description = write_file(self.target, self._tables(batches))
        yield described([] if description is None else [description])


@dataclass(frozen=True)
class SinkPartition:
    """mapInArrow: one partition (IPC blobs) -> ``task`` over all of its tables -> one ``RESULT`` row."""

    task: WriteTask[Any]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = (decode(blob) for batch in batches for blob in ipc_blobs(batch))
        yield from self.task.over(tables).to_batches()

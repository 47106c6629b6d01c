"""Spark's split write (``Engine.write_split``): executors write the lake tables' Parquet files, the driver commits them.

One ``mapInArrow`` task per partition of the graph output runs the split function the streaming
sink runs on the driver (the pipeline's ``SampleSplitter``), writes one samples file and, if any
record was quarantined, one quarantine file straight into the tables' folders, and sends back
only file descriptions, counts and the lineage rows. Lineage rows are range-partitioned and
sorted by sample_id on the executors and written in 32k-row groups, the layout ``Lake.commit``
gives every lineage commit (``SORTED_LAYOUT``): files cover disjoint sample_id ranges, so a
one-sample lookup reads one row group. The runner then commits each table once with the run
id as app transaction (``StagedFiles.commit``); until then no reader sees the files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datahub.engines.sink import SplitFn, SplitWritten
from datahub.engines.spark.arrow import ApplyChain, decode, encode, ipc_blobs, spark_schema
from datahub.engines.spark.frame import SparkFrame
from datahub.engines.spark.jobs import jobs_ended_on_exit
from datahub.engines.spark.parquet import WRITTEN_DDL, WriteParquet
from datahub.engines.spark.quiet import map_in_arrow
from datahub.lake.add_actions import DataFile, StagedFiles
from datahub.lake.files import ParquetTarget, conform, data_file, file_prefix, file_schema, parquet_files, spark_compatible_schema
from datahub.lake.lake import SORTED_LAYOUT
from datahub.lake.tables import LINEAGE, QUARANTINE

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.lake.lake import Lake

SPLIT = pa.schema([
    ("kind", pa.string()),  # "samples" | "quarantine" (a file written) | "lineage" (rows as IPC) | "counts"
    ("uri", pa.string()),
    ("size", pa.int64()),
    ("rows", pa.int64()),
    ("stats", pa.string()),  # Delta file stats; for "counts": SinkCounts JSON
    ("ipc", pa.binary()),
])
SPLIT_DDL = "kind string, uri string, size long, rows long, stats string, ipc binary"
SAMPLES_KIND, QUARANTINE_KIND, LINEAGE_KIND, COUNTS_KIND = "samples", "quarantine", "lineage", "counts"
# Rows per lineage file (one sample_id range each): 32 row groups of 32k rows.
LINEAGE_ROWS_PER_FILE = 1 << 20


@dataclass(frozen=True)
class SplitAndWrite:
    """mapInArrow: IPC blobs of graph output -> this partition's samples and quarantine files,
    its lineage rows (IPC blobs) and a counts row per batch. A target of None: not written (already committed)."""

    split: SplitFn
    input_schema: pa.Schema
    samples: ParquetTarget | None
    quarantine: ParquetTarget | None
    lineage: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        targets = {kind: target for kind, target in ((SAMPLES_KIND, self.samples), (QUARANTINE_KIND, self.quarantine))
                   if target is not None}
        counts: list[dict[str, Any]] = []
        with parquet_files(targets) as files:
            for batch in batches:
                for blob in ipc_blobs(batch):
                    table = decode(blob)
                    if not table.num_rows:
                        continue
                    split = self.split(conform(table, self.input_schema))
                    lineage_rows = split.lineage.num_rows if self.lineage else 0
                    counts.append({"kind": COUNTS_KIND, "rows": lineage_rows, "stats": split.counts_json()})
                    if SAMPLES_KIND in files:
                        files[SAMPLES_KIND].write(split.samples)
                    if QUARANTINE_KIND in files and split.quarantine is not None:
                        files[QUARANTINE_KIND].write(split.quarantine)
                    if lineage_rows:
                        yield _rows([{"kind": LINEAGE_KIND, "ipc": blob} for blob in encode(split.lineage)])
            written = {kind: file.close() for kind, file in files.items()}
        rows = [{"kind": kind, **description} for kind, description in written.items() if description is not None]
        yield _rows([*rows, *counts])


def _rows(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SPLIT)


def write_split(
    frame: Frame,
    split: SplitFn,
    lake: Lake,
    *,
    run_id: str,
    table: str = "samples",
    samples_schema: Callable[[pa.Schema], pa.Schema] = lambda schema: schema,
    lineage_rows_per_file: int = LINEAGE_ROWS_PER_FILE,
) -> SplitWritten:
    """Executors split ``frame`` (graph output) and write ``table``, quarantine and lineage files.

    ``samples_schema`` maps the frame's schema to the samples files' (the columns that reach the
    table). Tables that already hold this run's transaction (a re-run after a crash between commits)
    get no files; their commit is then a no-op. Nothing is committed here.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if not isinstance(frame, SparkFrame):
        raise TypeError(f"write_split needs a SparkFrame, got a {type(frame).__name__}")
    blobs, schema = frame.encoded_blobs()
    options = tuple(sorted(lake.storage_options.items()))
    prefix = file_prefix(run_id)
    lineage_column, row_group_rows = SORTED_LAYOUT["lineage"]

    def target(name: str, rows: pa.Schema, group_rows: int | None = None) -> ParquetTarget | None:
        if lake.applied(name, run_id):
            return None
        return ParquetTarget(lake.table_uri(name), file_schema(lake, name, rows), options, prefix, group_rows)

    samples = target(table, samples_schema(schema))
    quarantine = target("quarantine", QUARANTINE)
    lineage = target("lineage", LINEAGE, row_group_rows)
    written = map_in_arrow(blobs, SplitAndWrite(split, schema, samples, quarantine, lineage is not None), SPLIT_DDL)
    written = written.persist(StorageLevel.MEMORY_AND_DISK)  # run the split once; lineage rows are read again below
    # a failed task: the others end (and write no file) before the run's abort removes what was written
    with _unpersisted(written), jobs_ended_on_exit(frame.session):
        counts: list[str] = []
        lineage_total = 0
        files: dict[str, list[DataFile]] = {SAMPLES_KIND: [], QUARANTINE_KIND: []}
        for row in written.filter(F.col("kind") != LINEAGE_KIND).drop("ipc").collect():
            if row["kind"] == COUNTS_KIND:
                counts.append(row["stats"])
                lineage_total += int(row["rows"])
            else:
                files[row["kind"]].append(data_file(row.asDict()))
        lineage_files: list[DataFile] = []
        if lineage is not None and lineage_total:
            typed = map_in_arrow(written.filter(F.col("kind") == LINEAGE_KIND).select("ipc"),
                                 ApplyChain((), None, LINEAGE, node="lineage"), spark_schema(LINEAGE))
            ranges = max(1, math.ceil(lineage_total / lineage_rows_per_file))
            ordered = typed.repartitionByRange(ranges, lineage_column).sortWithinPartitions(lineage_column)
            lineage_files = [data_file(r.asDict()) for r in map_in_arrow(ordered, WriteParquet(lineage, encoded=False), WRITTEN_DDL).collect()]
    return SplitWritten(
        counts=counts,
        samples=_staged(files[SAMPLES_KIND], samples, samples_schema(schema)),
        quarantine=_staged(files[QUARANTINE_KIND], quarantine, QUARANTINE),
        lineage=_staged(lineage_files, lineage, LINEAGE),
    )


@contextmanager
def _unpersisted(frame: Any) -> Iterator[None]:
    try:
        yield
    finally:
        frame.unpersist()


def _staged(files: list[DataFile], target: ParquetTarget | None, schema: pa.Schema) -> StagedFiles:
    return StagedFiles(tuple(files), target.schema if target is not None else spark_compatible_schema(schema))

"""Spark's samples sink: executors write the lake tables' Parquet files, the driver commits them.

One ``mapInArrow`` task per partition of the graph output runs the same ``SampleSplitter``
the streaming sink runs (``datahub.pipeline.sinks``), writes one samples file and, if any
record was quarantined, one quarantine file straight into the tables' folders, and sends back
only file descriptions, counts and the lineage rows. Lineage rows are range-partitioned and
sorted by sample_id on the executors and written in 32k-row groups, the layout ``Lake.commit``
gives every lineage commit (``SORTED_LAYOUT``): files cover disjoint sample_id ranges, so a
one-sample lookup reads one row group. The runner then commits each table once with the run
id as app transaction (``StagedFiles.commit``); until then no reader sees the files.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datahub.engines.spark.arrow import ApplyChain, conform, decode, encode, ipc_blobs, spark_compatible_schema, spark_schema, unify
from datahub.engines.spark.frame import SparkFrame
from datahub.engines.spark.parquet import WRITTEN_DDL, ParquetTarget, WriteParquet
from datahub.lake.add_actions import DataFile, StagedFiles, txn_slug
from datahub.lake.lake import SORTED_LAYOUT
from datahub.lake.tables import LINEAGE, QUARANTINE
from datahub.pipeline.sinks import SampleSplitter, SinkCounts, WrittenSamples, samples_schema

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


def file_prefix(run_id: str) -> str:
    """Names of the files executors write for a run: ``spark-{run_id}-{uuid}.parquet``."""
    return f"spark-{txn_slug(run_id)}"


def file_schema(lake: Lake, table: str, schema: pa.Schema) -> pa.Schema:
    """The schema of new files for ``table``: its current schema merged with ``schema`` (Spark types).

    Every file of a run then has the same columns and types as the table (missing ones null).
    """
    if lake.exists(table):
        schema = unify([pa.schema(lake.table(table).schema().to_arrow()), schema])
    return spark_compatible_schema(schema)


@dataclass(frozen=True)
class SplitAndWrite:
    """mapInArrow: IPC blobs of graph output -> this partition's samples and quarantine files,
    its lineage rows (IPC blobs) and one counts row. A target of None: not written (already committed)."""

    splitter: SampleSplitter
    input_schema: pa.Schema
    samples: ParquetTarget | None
    quarantine: ParquetTarget | None
    lineage: bool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counts, lineage_rows = SinkCounts(), 0
        files = {kind: target.open() for kind, target in ((SAMPLES_KIND, self.samples), (QUARANTINE_KIND, self.quarantine))
                 if target is not None}
        try:
            for batch in batches:
                for blob in ipc_blobs(batch):
                    table = decode(blob)
                    if not table.num_rows:
                        continue
                    split = self.splitter.split(conform(table, self.input_schema))
                    counts.add(split.counts)
                    if SAMPLES_KIND in files:
                        files[SAMPLES_KIND].write(split.samples)
                    if QUARANTINE_KIND in files and split.quarantine is not None:
                        files[QUARANTINE_KIND].write(split.quarantine)
                    if self.lineage and split.lineage.num_rows:
                        lineage_rows += split.lineage.num_rows
                        yield _rows([{"kind": LINEAGE_KIND, "ipc": blob} for blob in encode(split.lineage)])
            written = {kind: file.close() for kind, file in files.items()}
        except BaseException:
            for file in files.values():
                file.abort()
            raise
        rows = [{"kind": kind, **description} for kind, description in written.items() if description is not None]
        yield _rows([*rows, {"kind": COUNTS_KIND, "rows": lineage_rows, "stats": counts.to_json()}])


def _rows(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SPLIT)


def write_samples(
    frame: Frame,
    splitter: SampleSplitter,
    lake: Lake,
    *,
    table: str = "samples",
    lineage_rows_per_file: int = LINEAGE_ROWS_PER_FILE,
) -> WrittenSamples:
    """Executors split ``frame`` (graph output) and write ``table``, quarantine and lineage files.

    Tables that already hold this run's transaction (a re-run after a crash between commits)
    get no files; their commit is then a no-op. Nothing is committed here.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    if not isinstance(frame, SparkFrame):
        raise TypeError(f"write_samples needs a SparkFrame, got a {type(frame).__name__}")
    blobs, schema = frame.encoded_blobs()
    options = tuple(sorted(lake.storage_options.items()))
    prefix = file_prefix(splitter.run_id)
    lineage_column, row_group_rows = SORTED_LAYOUT["lineage"]

    def target(name: str, rows: pa.Schema, group_rows: int | None = None) -> ParquetTarget | None:
        if lake.applied(name, splitter.run_id):
            return None
        return ParquetTarget(lake.table_uri(name), file_schema(lake, name, rows), options, prefix, group_rows)

    samples = target(table, samples_schema(schema))
    quarantine = target("quarantine", QUARANTINE)
    lineage = target("lineage", LINEAGE, row_group_rows)
    split = blobs.mapInArrow(SplitAndWrite(splitter, schema, samples, quarantine, lineage is not None), SPLIT_DDL)
    split = split.persist(StorageLevel.MEMORY_AND_DISK)  # run the split once; lineage rows are read again below
    try:
        counts, lineage_total = SinkCounts(), 0
        files: dict[str, list[DataFile]] = {SAMPLES_KIND: [], QUARANTINE_KIND: []}
        for row in split.filter(F.col("kind") != LINEAGE_KIND).drop("ipc").collect():
            if row["kind"] == COUNTS_KIND:
                counts.add(SinkCounts.from_json(row["stats"]))
                lineage_total += int(row["rows"])
            else:
                files[row["kind"]].append(_data_file(row))
        lineage_files: list[DataFile] = []
        if lineage is not None and lineage_total:
            typed = split.filter(F.col("kind") == LINEAGE_KIND).select("ipc").mapInArrow(
                ApplyChain((), None, LINEAGE, node="lineage"), spark_schema(LINEAGE))
            ranges = max(1, math.ceil(lineage_total / lineage_rows_per_file))
            ordered = typed.repartitionByRange(ranges, lineage_column).sortWithinPartitions(lineage_column)
            lineage_files = [_data_file(r) for r in ordered.mapInArrow(WriteParquet(lineage, encoded=False), WRITTEN_DDL).collect()]
    finally:
        split.unpersist()
    return WrittenSamples(
        counts=counts,
        samples=_staged(files[SAMPLES_KIND], samples, samples_schema(schema)),
        quarantine=_staged(files[QUARANTINE_KIND], quarantine, QUARANTINE),
        lineage=_staged(lineage_files, lineage, LINEAGE),
    )


def write_side_output(lake: Lake, table: str, frames: Sequence[SparkFrame], *, txn: str) -> StagedFiles | None:
    """Executors write the parts a global operator added for ``table`` (e.g. minhash_index).

    None when the parts hold no rows; no files (a no-op commit) when ``txn`` is already there.
    """
    if lake.applied(table, txn):
        return StagedFiles((), pa.schema([]))
    merged = file_schema(lake, table, unify([frame.schema for frame in frames]))
    files = [f for frame in frames for f in frame.write_parquet(
        lake.table_uri(table), storage_options=lake.storage_options, prefix=file_prefix(txn), schema=merged)]
    if not sum(f.rows for f in files):
        return None
    return StagedFiles(tuple(files), merged)


def _staged(files: list[DataFile], target: ParquetTarget | None, schema: pa.Schema) -> StagedFiles:
    return StagedFiles(tuple(files), target.schema if target is not None else spark_compatible_schema(schema))


def _data_file(row: Any) -> DataFile:
    return DataFile(uri=row["uri"], size=int(row["size"]), rows=int(row["rows"]), stats=row["stats"])

"""Sinks: where rows leave the graph.

The samples sink splits every batch of the graph's output three ways (``SampleSplitter``):
live samples, quarantined records, and lineage events (ingested, modified, annotated,
dropped, quarantined), and counts them. On Ray (and any engine that streams) the batches
reach the driver and go to local staging Parquet files (lineage in 16 sample_id ranges),
copied into the tables' folders row group by row group at commit time; on Spark the executors
run the same splitter and write the Parquet files straight into the tables' folders
(``datahub.engines.spark.sink``). Either way each table is then one idempotent commit of add
actions (``Staged.commit``) with the run id as its Delta app transaction; ``--full``'s
predicate overwrite streams the staged rows through delta-rs instead.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datahub.engines.spark.parquet import WRITTEN, ParquetTarget
from datahub.errors import LakeError
from datahub.lake.add_actions import DataFile, StagedFiles, txn_slug
from datahub.lake.lake import SORTED_LAYOUT, Lake
from datahub.lake.tables import LINEAGE, QUARANTINE
from datahub.operator import DROP_OP, DROP_REASON, DROP_REF, EVENT_PREFIX, QUARANTINED, is_envelope_column
from datahub.pipeline.faults import checkpoint
from datahub.pipeline.ingest import INGEST_OP
from datahub.retry import retry_policy, storage_errors

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.pipeline.context import RunContext


@dataclass
class SinkCounts:
    records_read: int = 0
    samples_written: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    quarantined: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "records_read": self.records_read,
            "samples_written": self.samples_written,
            "dropped": dict(sorted(self.dropped.items())),
            "dropped_total": sum(self.dropped.values()),
            "quarantined": dict(sorted(self.quarantined.items())),
            "quarantined_total": sum(self.quarantined.values()),
        }

    def add(self, other: SinkCounts) -> None:
        self.records_read += other.records_read
        self.samples_written += other.samples_written
        self.dropped.update(other.dropped)
        self.quarantined.update(other.quarantined)

    def to_json(self) -> str:
        """Lossless JSON (reasons as pairs, so a null reason survives), for counts made on executors."""
        return json.dumps([self.records_read, self.samples_written, list(self.dropped.items()), list(self.quarantined.items())])

    @classmethod
    def from_json(cls, text: str) -> SinkCounts:
        read, written, dropped, quarantined = json.loads(text)
        return cls(read, written, Counter(dict(map(tuple, dropped))), Counter(dict(map(tuple, quarantined))))


class Staged(Protocol):
    """Rows of one table staged by a run, committed once with the run's transaction id."""

    def commit(self, lake: Lake, table: str, *, txn: str, metadata: Mapping[str, Any] | None = None,
               empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
        """Commit to ``table``; the new version, or None (nothing staged, or ``txn`` already there).

        With nothing staged the table is only created (with ``empty_schema``) when missing.
        ``replace`` (SQL) overwrites the rows it matches instead of appending (``--full``).
        """


# Rows split and staged at once: the splitter's copies and the Parquet row group being encoded cost a few
# times the slice (whole blocks of 62,500 short documents: ~35 MB more on the driver at its peak).
SINK_SLICE_ROWS = 16384
# Sample ids are hex digests: staged rows of a sorted table go to 16 files by their first
# digit (any string lands in the range it sorts in), so a commit sorts one sixteenth at a time.
_RANGE_BOUNDS = [f"{i:x}" for i in range(1, 16)]


def range_buckets(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per value, which of 16 ordered string ranges holds it (``_RANGE_BOUNDS``); null -> 0."""
    bucket = np.zeros(len(values), np.int8)
    for bound in _RANGE_BOUNDS:
        bucket += pc.fill_null(pc.greater_equal(values, bound), False).to_numpy(zero_copy_only=False)
    return bucket


class _Staged:
    """Parquet files under one local staging dir, opened lazily, one schema per table.

    A commit streams the files (never the whole table in memory). A table in
    ``SORTED_LAYOUT`` (lineage) is staged in 16 files by ``sample_id`` range, so its commit
    sorts one range at a time and still writes the rows in one global order.
    """

    def __init__(self, directory: str, name: str) -> None:
        self.directory, self.name = directory, name
        self.layout = SORTED_LAYOUT.get(name)
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.schema: pa.Schema | None = None
        self.rows = 0

    def _path(self, bucket: int) -> str:
        return os.path.join(self.directory, f"{self.name}-{bucket:02d}.parquet")

    def _write(self, bucket: int, table: pa.Table) -> None:
        if bucket not in self.writers:
            self.writers[bucket] = pq.ParquetWriter(self._path(bucket), self.schema)
        self.writers[bucket].write_table(table)

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.schema is None:
            self.schema = table.schema
        elif table.schema != self.schema:
            table = _conform(table, self.schema)
        self.rows += table.num_rows
        if self.layout is None or self.layout[0] not in table.column_names:
            self._write(0, table)
            return
        buckets = range_buckets(table.column(self.layout[0]))
        for bucket in np.unique(buckets).tolist():
            self._write(bucket, table.filter(pa.array(buckets == bucket)))

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The staged rows, file by file (each range sorted for a sorted table)."""
        for batches in self._bucket_batches():
            yield from batches

    def _bucket_batches(self) -> Iterator[Iterator[pa.RecordBatch]]:
        for bucket in sorted(self.writers):
            yield self._read(bucket)

    def _read(self, bucket: int) -> Iterator[pa.RecordBatch]:
        if self.layout is None:  # row group by row group: iter_batches buffers far more
            staged = pq.ParquetFile(self._path(bucket))
            for group in range(staged.num_row_groups):
                yield from staged.read_row_group(group).to_batches()
        else:
            yield from pq.read_table(self._path(bucket)).sort_by([(self.layout[0], "ascending")]).to_batches(65536)

    def commit(self, lake: Lake, table: str, *, txn: str, metadata: Mapping[str, Any] | None = None,
               empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
        if not self.writers:
            return commit_rows(lake, table, None, txn=txn, metadata=metadata, empty_schema=empty_schema, replace=replace)
        schema = self.schema
        assert schema is not None
        if replace is None:
            def copy() -> StagedFiles:  # a storage outage while copying: copy again (new file names)
                with storage_errors(f"stage {self.rows} rows for {lake.table_uri(table)} ({txn})"):
                    return self._as_table_files(lake, table, txn)

            return retry_policy(copy, lake.retry).commit(lake, table, txn=txn, metadata=metadata)

        def attempt() -> int | None:  # a fresh stream per attempt: a failed one cannot be replayed
            return lake.commit(table, pa.RecordBatchReader.from_batches(schema, self.batches()), txn=txn,
                               metadata=metadata, mode="overwrite" if replace else "append", predicate=replace,
                               row_group_rows=self.layout[1] if self.layout else None, retry=False)

        return retry_policy(attempt, lake.retry)

    def _as_table_files(self, lake: Lake, table: str, txn: str) -> StagedFiles:
        """Copy the staged rows into Parquet files in the table's folder (uncommitted), one row group
        at a time, in the table's schema: the commit is then add actions only, as for Spark's
        executors, and the driver never holds more than a row group (delta-rs's writer held
        ~600 MB for 1M short samples)."""
        from datahub.engines.spark.sink import file_schema

        if lake.applied(table, txn):
            return StagedFiles((), pa.schema([]))
        assert self.schema is not None
        try:
            schema = file_schema(lake, table, self.schema)
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise LakeError(f"{lake.table_uri(table)}: the run's rows do not fit the table's schema ({exc}); "
                            "fix or migrate the table's column, then re-run") from exc
        target = ParquetTarget(lake.table_uri(table), schema,
                               tuple(sorted(lake.storage_options.items())), f"part-{txn_slug(txn)}",
                               self.layout[1] if self.layout else None)
        files = []
        for batches in self._bucket_batches():
            file = target.open()
            try:
                for batch in batches:
                    file.write(pa.Table.from_batches([batch]))
                description = file.close()
            except BaseException:
                file.abort()
                raise
            pa.default_memory_pool().release_unused()
            if description is not None:
                files.append(DataFile(uri=description["uri"], size=int(description["size"]),
                                      rows=int(description["rows"]), stats=description["stats"]))
        return StagedFiles(tuple(files), target.schema)


def commit_rows(lake: Lake, table: str, data: pa.Table | None, *, txn: str, metadata: Mapping[str, Any] | None = None,
                empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
    """``Staged.commit`` for rows on the driver: one ``Lake.commit``."""
    if data is None:
        if empty_schema is None or lake.exists(table):
            return None
        data = empty_schema.empty_table()  # create the table so readers find it
    return lake.commit(table, data, txn=txn, metadata=metadata, mode="overwrite" if replace else "append", predicate=replace)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Fit a batch to the first batch's schema (struct fields may appear in later batches)."""
    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type, safe=False) if table.schema.field(f.name).type != f.type else table.column(f.name))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class SplitBatch:
    """One batch of graph output, split: rows for samples, quarantine and lineage, and their counts."""

    samples: pa.Table
    quarantine: pa.Table | None
    lineage: pa.Table
    counts: SinkCounts


@dataclass(frozen=True)
class SampleSplitter:
    """What a samples sink does to each batch; plain pyarrow and picklable.

    The driver-side ``SamplesSink`` runs it per streamed batch, Spark executors per batch of
    their partition (``datahub.engines.spark.sink``): one definition of the samples columns,
    the lineage events and the counts for every engine.
    """

    run_id: str
    node_ops: Mapping[str, tuple[str, str]]  # graph node -> (op name@version, params_hash)
    write_ingested: bool = True
    ts: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def split(self, batch: pa.Table) -> SplitBatch:
        counts = SinkCounts(records_read=batch.num_rows)
        if not batch.num_rows:
            return SplitBatch(samples_columns(batch), None, LINEAGE.empty_table(), counts)
        reason = batch.column(DROP_REASON)
        quarantined = pc.fill_null(batch.column(QUARANTINED), False) if QUARANTINED in batch.column_names else pa.array([False] * batch.num_rows)
        alive = pc.is_null(reason)
        dropped = pc.and_(pc.is_valid(reason), pc.invert(quarantined))

        live = samples_columns(batch.filter(alive))
        counts.samples_written = live.num_rows
        bad = batch.filter(quarantined)
        quarantine = None
        if bad.num_rows:
            counts.quarantined.update(bad.column(DROP_REASON).to_pylist())
            quarantine = self._quarantine_rows(bad)
        gone = batch.filter(dropped)
        if gone.num_rows:
            counts.dropped.update(gone.column(DROP_REASON).to_pylist())
        return SplitBatch(live, quarantine, self._lineage_rows(batch, alive, dropped, quarantined), counts)

    def _quarantine_rows(self, bad: pa.Table) -> pa.Table:
        n = bad.num_rows
        text_bytes = pc.cast(bad.column("text"), pa.binary())
        raw = pc.coalesce(bad.column("_raw"), pc.binary_slice(text_bytes, 0, 4096))
        details = [None if r is None else json.loads(r).get("detail") for r in bad.column(DROP_REF).to_pylist()]
        return pa.table(
            {
                "source_uri": bad.column("source_uri"),
                "source_offset": bad.column("source_offset"),
                "source_format": bad.column("source_format"),
                "reason": bad.column(DROP_REASON),
                "detail": pa.array(details, pa.string()),
                "raw": raw,
                "raw_size": bad.column("_raw_size"),
                "run_id": pa.array([self.run_id] * n, pa.string()),
                "ts": pa.array([self.ts] * n, pa.timestamp("us", tz="UTC")),
            },
            schema=QUARANTINE,
        )

    def _lineage_rows(self, batch: pa.Table, alive: pa.Array, dropped: pa.Array, quarantined: pa.Array) -> pa.Table:
        parts: list[pa.Table] = []
        has_id = pc.is_valid(batch.column("sample_id"))

        def events(mask: pa.Array, op: pa.Array | str, params_hash: str | None, action: str,
                   reason: pa.Array | None, ref: pa.Array | None) -> None:
            keep = pc.and_(mask, has_id)
            rows = batch.filter(keep)
            if not rows.num_rows:
                return
            n = rows.num_rows

            def pick(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
                return values.filter(keep)

            parts.append(
                pa.table(
                    {
                        "sample_id": rows.column("sample_id"),
                        "run_id": pa.array([self.run_id] * n, pa.string()),
                        "op": pa.array([op] * n, pa.string()) if isinstance(op, str) else pick(op),
                        "params_hash": pa.array([params_hash] * n, pa.string()),
                        "action": pa.array([action] * n, pa.string()),
                        "reason": pa.nulls(n, pa.string()) if reason is None else pick(reason),
                        "ref": pa.nulls(n, pa.string()) if ref is None else pick(ref),
                        "ts": pa.array([self.ts] * n, pa.timestamp("us", tz="UTC")),
                    },
                    schema=LINEAGE,
                )
            )

        everything = pa.array([True] * batch.num_rows)
        if self.write_ingested:
            origin = pc.binary_join_element_wise(
                pa.array(['{"source_uri": '] * batch.num_rows),
                _json_strings(batch.column("source_uri")),
                pa.array([', "source_offset": '] * batch.num_rows),
                pc.cast(batch.column("source_offset"), pa.string()),
                pa.array(["}"] * batch.num_rows),
                "",
            )
            events(everything, INGEST_OP, None, "ingested", None, origin)
        for column in batch.column_names:
            if column.startswith(EVENT_PREFIX):
                node = column[len(EVENT_PREFIX):]
                op, params_hash = self.node_ops[node]
                action = batch.column(column)
                for kind in ("modified", "annotated"):
                    events(pc.fill_null(pc.equal(action, kind), False), op, params_hash, kind, None, None)
        events(dropped, batch.column(DROP_OP), None, "dropped", batch.column(DROP_REASON), batch.column(DROP_REF))
        events(quarantined, batch.column(DROP_OP), None, "quarantined", batch.column(DROP_REASON), None)
        if not parts:
            return LINEAGE.empty_table()
        return pa.concat_tables(parts)


def samples_columns(rows: pa.Table) -> pa.Table:
    """The columns of graph output that reach ``samples``: all but the envelope (``_``-prefixed)."""
    return rows.select([name for name in rows.column_names if not is_envelope_column(name)])


def samples_schema(schema: pa.Schema) -> pa.Schema:
    """``samples_columns`` for a schema."""
    return pa.schema([f for f in schema if not is_envelope_column(f.name)])


@dataclass
class SamplesSink:
    """The streaming samples sink: batches reach the driver and go to local staging files."""

    staging_dir: str
    run_id: str
    node_ops: dict[str, tuple[str, str]]  # graph node -> (op name@version, params_hash)
    write_ingested: bool = True
    counts: SinkCounts = field(default_factory=SinkCounts)

    def __post_init__(self) -> None:
        os.makedirs(self.staging_dir, exist_ok=True)
        self.samples = _Staged(self.staging_dir, "samples")
        self.quarantine = _Staged(self.staging_dir, "quarantine")
        self.lineage = _Staged(self.staging_dir, "lineage")
        self.splitter = SampleSplitter(self.run_id, self.node_ops, self.write_ingested)

    def consume(self, batches: Iterable[pa.Table], progress: object = None) -> None:
        for batch in batches:
            self.write_batch(batch)
            if callable(progress):
                progress(self.counts.records_read)
        for staged in (self.samples, self.quarantine, self.lineage):
            staged.close()
        pa.default_memory_pool().release_unused()

    def write_batch(self, batch: pa.Table) -> None:
        for start in range(0, batch.num_rows, SINK_SLICE_ROWS):
            self._write_slice(batch.slice(start, SINK_SLICE_ROWS))

    def _write_slice(self, batch: pa.Table) -> None:
        split = self.splitter.split(batch)
        self.counts.add(split.counts)
        self.samples.write(split.samples)
        if split.quarantine is not None:
            self.quarantine.write(split.quarantine)
        self.lineage.write(split.lineage)


@dataclass
class WrittenSamples:
    """A samples sink whose files the engine's workers wrote into the tables' folders, uncommitted."""

    counts: SinkCounts
    samples: Staged
    quarantine: Staged
    lineage: Staged


def drain_samples(frame: Frame, context: RunContext, staging_dir: str, node_ops: dict[str, tuple[str, str]], *,
                  table: str = "samples", write_ingested: bool = True) -> SamplesSink | WrittenSamples:
    """Run a samples sink over the graph output ``frame``; the runner commits what it staged.

    Spark: the executors split the rows and write the tables' Parquet files themselves
    (``datahub.engines.spark.sink``); only counts and file names reach the driver. Other
    engines, and Spark under ``--full`` (whose replacement of a job's rows is a delta-rs
    predicate overwrite of rows on the driver), stream the batches to local staging files.
    """
    if context.engine.name == "spark" and not context.full:
        from datahub.engines.spark.sink import write_samples

        splitter = SampleSplitter(context.run_id, node_ops, write_ingested)
        written = write_samples(frame, splitter, context.lake, table=table)
        checkpoint("streaming")  # every file written, nothing committed
        context.report("rows", written.counts.records_read)
        return written
    sink = SamplesSink(staging_dir, context.run_id, node_ops, write_ingested=write_ingested)
    def progress(done: int) -> None:
        checkpoint("streaming")
        context.report("rows", done)

    sink.consume(frame.iter_batches(), progress=progress)
    return sink


@dataclass(frozen=True)
class WriteFile:
    """Batch function: the batch as one Parquet file of ``target`` (written by the worker that holds
    it); returns that file's description row (none for an empty batch)."""

    target: ParquetTarget

    def __call__(self, table: pa.Table) -> pa.Table:
        file = self.target.open()
        try:
            file.write(table)
            description = file.close()
        except BaseException:
            file.abort()
            raise
        return pa.Table.from_pylist([] if description is None else [description], schema=WRITTEN)


def stage_side_output(context: RunContext, table: str, data: Frame | pa.Table) -> StagedFiles | None:
    """Write what a global operator adds to ``table`` (e.g. minhash_index) into the table's folder, uncommitted.

    The engine's workers write the files (one per block or partition), so the rows never
    gather on the driver and their blocks can be freed before the samples are drained; the
    runner commits them after the samples. None when there are no rows; no files (a no-op
    commit) when the run's transaction is already in the table.
    """
    from datahub.engines.spark.sink import file_prefix, file_schema, write_side_output

    lake, txn = context.lake, context.run_id
    frame = context.engine.from_arrow(data) if isinstance(data, pa.Table) else data

    def attempt() -> StagedFiles | None:  # a storage outage while writing: write again (new file names)
        with storage_errors(f"write {table} files for {txn}"):
            if lake.applied(table, txn):
                return StagedFiles((), pa.schema([]))
            if context.engine.name == "spark":
                return write_side_output(lake, table, [frame], txn=txn)  # type: ignore[list-item]
            schema = file_schema(lake, table, frame.empty().schema)
            target = ParquetTarget(lake.table_uri(table), schema, tuple(sorted(lake.storage_options.items())), file_prefix(txn))
            written = frame.map_batches(WriteFile(target), name=f"write_{table}").to_arrow()
            files = tuple(DataFile(uri=r["uri"], size=int(r["size"]), rows=int(r["rows"]), stats=r["stats"])
                          for r in written.to_pylist())
            return StagedFiles(files, schema) if sum(f.rows for f in files) else None

    return retry_policy(attempt, lake.retry)


def combined(parts: list[StagedFiles]) -> StagedFiles:
    """One commit's worth of files from several stagings of one table."""
    from datahub.engines.spark.arrow import unify

    if len(parts) == 1:
        return parts[0]
    schemas = [p.schema for p in parts if p.files] or [parts[0].schema]
    return StagedFiles(tuple(f for p in parts for f in p.files), unify(schemas))


def _json_strings(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.array([json.dumps(v) for v in values.to_pylist()], pa.string())


@dataclass
class StatsSink:
    """Counts per source file and per drop reason on one branch, kept in the run record."""

    by_source: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    rows: int = 0
    chars: int = 0

    def consume(self, batches: Iterable[pa.Table]) -> None:
        for batch in batches:
            self.rows += batch.num_rows
            alive = pc.is_null(batch.column(DROP_REASON))
            live = batch.filter(alive)
            self.by_source.update(live.column("source_uri").to_pylist())
            self.by_reason.update(r for r in batch.column(DROP_REASON).to_pylist() if r is not None)
            if live.num_rows:
                self.chars += int(pc.sum(pc.utf8_length(live.column("text"))).as_py() or 0)

    def as_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "live_chars": self.chars, "live_by_source": dict(sorted(self.by_source.items())),
                "dropped_by_reason": dict(sorted(self.by_reason.items()))}

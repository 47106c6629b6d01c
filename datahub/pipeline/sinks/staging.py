"""Rows staged by a run on the driver: local Parquet files per table, committed once with the run's
transaction id (``Staged.commit``), streamed (never the whole table in memory)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datahub.errors import LakeError
from datahub.lake.add_actions import StagedFiles, txn_slug
from datahub.lake.files import ParquetTarget, conform, data_file, file_schema, write_file
from datahub.lake.lake import SORTED_LAYOUT, Lake
from datahub.retry import retry_policy, storage_errors


class Staged(Protocol):
    """Rows of one table staged by a run, committed once with the run's transaction id."""

    def commit(self, lake: Lake, table: str, *, txn: str, metadata: Mapping[str, Any] | None = None,
               empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
        """Commit to ``table``; the new version, or None (nothing staged, or ``txn`` already there).

        With nothing staged the table is only created (with ``empty_schema``) when missing.
        ``replace`` (SQL) overwrites the rows it matches instead of appending (``--full``).
        """


# Sample ids are hex digests: staged rows of a sorted table go to 16 files by their first
# digit (any string lands in the range it sorts in), so a commit sorts one sixteenth at a time.
_RANGE_BOUNDS = [f"{i:x}" for i in range(1, 16)]


def range_buckets(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per value, which of 16 ordered string ranges holds it (``_RANGE_BOUNDS``); null -> 0."""
    bucket = np.zeros(len(values), np.int8)
    for bound in _RANGE_BOUNDS:
        bucket += pc.fill_null(pc.greater_equal(values, bound), False).to_numpy(zero_copy_only=False)
    return bucket


class StagedRows:
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
            table = conform(table, self.schema)
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
            description = write_file(target, (pa.Table.from_batches([batch]) for batch in batches))
            pa.default_memory_pool().release_unused()
            if description is not None:
                files.append(data_file(description))
        return StagedFiles(tuple(files), target.schema)


def commit_rows(lake: Lake, table: str, data: pa.Table | None, *, txn: str, metadata: Mapping[str, Any] | None = None,
                empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
    """``Staged.commit`` for rows on the driver: one ``Lake.commit``."""
    if data is None:
        if empty_schema is None or lake.exists(table):
            return None
        data = empty_schema.empty_table()  # create the table so readers find it
    return lake.commit(table, data, txn=txn, metadata=metadata, mode="overwrite" if replace else "append", predicate=replace)

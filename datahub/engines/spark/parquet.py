"""Executors write Parquet files into a Delta table's folder; the driver commits them (add actions).

A ``ParquetTarget`` says where (a local or s3:// folder), with which schema and row groups;
a ``ParquetFile`` is one file of it written by one task and described for a Delta add
action (uri, size, rows, file statistics). Nothing here commits: an uncommitted file is
invisible to every Delta reader and vacuum removes it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from datahub.engines.sink import WriteTask
from datahub.engines.spark.arrow import conform, decode, from_spark_side, ipc_blobs

WRITTEN = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("stats", pa.string())])
WRITTEN_DDL = "uri string, size long, rows long, stats string"
_STATS_MAX_STRING = 32  # Delta's default string stats prefix length; longer bounds are truncated to it
_MAX_CHAR = "\U0010ffff"  # sorts after every other character, in code points and in UTF-8 bytes


@dataclass(frozen=True)
class ParquetTarget:
    """Where and how executor tasks write Parquet: a folder, the file schema, a row-group cap.

    ``prefix`` starts every file name (e.g. ``spark-{run_id}``), so a table's files show which
    run wrote them; ``row_group_rows`` buffers rows into full row groups of that size.
    """

    directory: str
    schema: pa.Schema
    storage_options: tuple[tuple[str, str], ...] = ()
    prefix: str = "part"
    row_group_rows: int | None = None

    def open(self) -> ParquetFile:
        return ParquetFile(self)


class ParquetFile:
    """One Parquet file under a target: created on the first row, described once closed."""

    def __init__(self, target: ParquetTarget) -> None:
        import fsspec

        from datahub.lake.lake import fsspec_options

        self.target = target
        self.fs, root = fsspec.core.url_to_fs(target.directory, **fsspec_options(dict(target.storage_options)))
        self.root = root.rstrip("/")
        self.path = f"{self.root}/{target.prefix}-{uuid.uuid4().hex}.parquet"
        scheme = target.directory.split("://", 1)[0] + "://" if "://" in target.directory else ""
        self.uri = scheme + self.path
        self.stats = FileStats(target.schema)
        self._writer: Any = None
        self._handle: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        table = conform(table, self.target.schema)
        self.stats.update(table)
        limit = self.target.row_group_rows
        if limit is None:
            self._write(table)
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= limit:  # whole row groups now, the rest waits for more rows
            buffered = pa.concat_tables(self._pending)
            full = (buffered.num_rows // limit) * limit
            self._write(buffered.slice(0, full))
            rest = buffered.slice(full)
            self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    def _write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self.fs.makedirs(self.root, exist_ok=True)
            self._handle = self.fs.open(self.path, "wb")
            self._writer = pq.ParquetWriter(self._handle, self.target.schema)
        self._writer.write_table(table, row_group_size=self.target.row_group_rows)

    def close(self) -> dict[str, Any] | None:
        """Finish the file; its description (``WRITTEN`` row), or None when no row was written."""
        if self._pending:
            self._write(pa.concat_tables(self._pending))
            self._pending, self._pending_rows = [], 0
        if self._writer is None:
            return None
        self._writer.close()
        self._handle.close()
        size = int(self.fs.info(self.path)["size"])
        return {"uri": self.uri, "size": size, "rows": self.stats.rows, "stats": self.stats.to_json()}

    def abort(self) -> None:
        """A failed task: drop what was written (best effort; an uncommitted file is invisible anyway)."""
        if self._writer is None:
            return
        try:
            self._writer.close()
            self._handle.close()
            self.fs.rm(self.path)
        except Exception:  # noqa: BLE001 - the task's own error matters more
            pass


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
        file = self.target.open()
        try:
            for table in self._tables(batches):
                file.write(table)
            description = file.close()
        except BaseException:
            file.abort()
            raise
        yield described([] if description is None else [description])


@dataclass(frozen=True)
class SinkPartition:
    """mapInArrow: one partition (IPC blobs) -> ``task`` over all of its tables -> one ``RESULT`` row."""

    task: WriteTask[Any]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tables = (decode(blob) for batch in batches for blob in ipc_blobs(batch))
        yield from self.task.over(tables).to_batches()


class FileStats:
    """Delta file statistics (numRecords, minValues, maxValues, nullCount) of top-level primitive columns."""

    def __init__(self, schema: pa.Schema) -> None:
        self.rows = 0
        self.columns = [f.name for f in schema if _stat_type(f.type)]
        self.min: dict[str, Any] = {}
        self.max: dict[str, Any] = {}
        self.nulls: dict[str, int] = {name: 0 for name in self.columns}

    def update(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += table.num_rows
        for name in self.columns:
            column = table.column(name)
            self.nulls[name] += column.null_count
            bounds = pc.min_max(column)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is None:
                continue
            self.min[name] = low if name not in self.min else min(self.min[name], low)
            self.max[name] = high if name not in self.max else max(self.max[name], high)

    def to_json(self) -> str:
        def bound(value: Any, upper: bool) -> Any:
            if isinstance(value, str) and len(value) > _STATS_MAX_STRING:
                # a prefix is a lower bound; the prefix and the largest code point an upper one
                return value[:_STATS_MAX_STRING] + (_MAX_CHAR if upper else "")
            return value.isoformat().replace("+00:00", "Z") if hasattr(value, "isoformat") else value

        # Every stat column needs both bounds: deltalake 1.6's pyarrow dataset turns a missing one into
        # "column >= null", which prunes the file for any filter on that column (long source URIs).
        mins = {k: bound(v, False) for k, v in self.min.items()}
        maxs = {k: bound(v, True) for k, v in self.max.items()}
        return json.dumps({"numRecords": self.rows, "minValues": mins, "maxValues": maxs, "nullCount": self.nulls})


def _stat_type(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_timestamp(t) or pa.types.is_date(t))

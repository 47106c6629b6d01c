"""Parquet files written into a Delta table's folder, uncommitted: the one place files are written then
closed or aborted (``write_file``), by the driver or by engine tasks.

A ``ParquetTarget`` says where (a local or s3:// folder), with which schema and row groups; a
``ParquetFile`` is one file of it, described for a Delta add action (uri, size, rows, file statistics).
Nothing here commits (``datahub.lake.add_actions`` does): an uncommitted file is invisible to every Delta
reader and vacuum removes it. Files of every engine use Spark-compatible types, so a table's files
agree whichever engine wrote them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from datahub.lake.add_actions import DataFile, txn_slug
from datahub.lake.lake import COMPRESSION, PAGE_CHECK_ROWS, fsspec_options

if TYPE_CHECKING:
    from datahub.lake.lake import Lake

WRITTEN = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("stats", pa.string())])
_STATS_MAX_STRING = 32  # Delta's default string stats prefix length; longer bounds are truncated to it
_MAX_CHAR = "\U0010ffff"  # sorts after every other character, in code points and in UTF-8 bytes




# ---- types and conforming ----------------------------------------------------------------


def spark_compatible_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type Spark can carry for ``arrow_type`` (Spark has no unsigned, null or fixed-size types)."""
    t = arrow_type
    if pa.types.is_null(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_uint16(t):
        return pa.int32()
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint64(t):
        return pa.decimal128(20, 0)  # exact and order-preserving, unlike a wrapping int64
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_dictionary(t):
        return spark_compatible_type(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, spark_compatible_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(spark_compatible_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(spark_compatible_type(t.key_type), spark_compatible_type(t.item_type))
    return t


def spark_compatible_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, spark_compatible_type(f.type)) for f in schema])


def conform_array(values: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array:
    """Cast ``values`` to ``target``; struct fields are matched by name, missing ones become null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], values.type)
    if values.type == target:
        return values
    n = len(values)
    if pa.types.is_null(target):
        return pa.nulls(n)
    if pa.types.is_null(values.type):
        return pa.nulls(n, target)
    if pa.types.is_struct(target) and pa.types.is_struct(values.type):
        present = {values.type.field(i).name: i for i in range(values.type.num_fields)}
        children = [
            conform_array(values.field(present[f.name]), f.type) if f.name in present else pa.nulls(n, f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=values.is_null() if values.null_count else None)
    # unsafe: uint64 <-> decimal128(20, 0) and timestamp unit changes are exact here
    return values.cast(target, safe=False)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns: cast by name, missing columns all null."""
    if table.schema == schema:
        return table
    n = table.num_rows
    columns = [
        conform_array(table.column(f.name), f.type) if f.name in table.column_names else pa.nulls(n, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def unify(schemas: Iterable[pa.Schema]) -> pa.Schema:
    """One schema for batches that may lack columns or struct fields (nulls promote to the real type)."""
    return pa.unify_schemas(list(schemas), promote_options="permissive")



# ---- files -------------------------------------------------------------------------------


def file_prefix(txn: str) -> str:
    """Names of the files written for a transaction (a run id): ``spark-{txn}-{uuid}.parquet``."""
    return f"spark-{txn_slug(txn)}"


def file_schema(lake: Lake, table: str, schema: pa.Schema) -> pa.Schema:
    """The schema of new files for ``table``: its current schema merged with ``schema`` (Spark types).

    Every file of a run then has the same columns and types as the table (missing ones null).
    """
    if lake.exists(table):
        schema = unify([pa.schema(lake.table(table).schema().to_arrow()), schema])
    return spark_compatible_schema(schema)


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
            self._writer = pq.ParquetWriter(self._handle, self.target.schema, compression=COMPRESSION,
                                            write_batch_size=PAGE_CHECK_ROWS)
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


K = TypeVar("K")


@contextmanager
def parquet_files(targets: Mapping[K, ParquetTarget]) -> Iterator[dict[K, ParquetFile]]:
    """One open file per target (none for a target of None); an error inside the block aborts them all
    (removes what was written) and re-raises. Close the files inside the block: a failed close aborts too."""
    files = {key: target.open() for key, target in targets.items()}
    try:
        yield files
    except BaseException:
        for file in files.values():
            file.abort()
        raise


def write_file(target: ParquetTarget, tables: Iterable[pa.Table]) -> dict[str, Any] | None:
    """Write ``tables`` as one file of ``target``; its description (``WRITTEN`` row), or None for no rows."""
    with parquet_files({0: target}) as files:
        for table in tables:
            files[0].write(table)
        return files[0].close()


def remove_files(target: ParquetTarget, uris: Iterable[str]) -> None:
    """Remove uncommitted files of ``target`` (an aborted write; best effort: they are invisible anyway)."""
    uris = list(uris)
    if not uris:
        return
    import fsspec

    options = fsspec_options(dict(target.storage_options))
    for uri in uris:
        try:
            fs, path = fsspec.core.url_to_fs(uri, **options)
            fs.rm(path)
        except Exception:  # noqa: BLE001 - the write's own error matters more
            pass


def data_file(description: dict[str, Any]) -> DataFile:
    """The add-action description of a written file (a ``WRITTEN`` row)."""
    return DataFile(uri=description["uri"], size=int(description["size"]), rows=int(description["rows"]),
                    stats=description["stats"])


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

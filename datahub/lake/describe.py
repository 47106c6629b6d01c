"""What a lake holds, from the Delta log: what ``datahub inspect`` shows, as a function."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN
from datahub.lake.delta_log import deleted_row_counts
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.lake.timestamps import iso_utc_from_millis

KIND_BATCH_ROWS = 1 << 16  # rows of the kind column counted at a time


def describe_lake(lake: Lake, table: str | None = None) -> dict[str, Any]:
    """Describe a lake (every table) or one table: version, rows, files, schema, recent commits, and for one table
    with a ``kind`` column its rows per kind (``kind_counts``).

    From the Delta log only (add actions, metadata, history), except the per-kind counts of one table: from the
    log's per-file statistics, and a streamed pass over the ``kind`` column of files that hold several kinds.
    """
    names = [table] if table else lake.tables()
    out: dict[str, Any] = {"lake": lake.root, "tables": {}}
    for name in names:
        dt = lake.table(name)
        actions = pa.table(dt.get_add_actions(flatten=True))
        rows, deleted, unknown = live_rows(lake, name, dt, actions)
        info: dict[str, Any] = {
            "version": dt.version(),
            "rows": rows,  # None: unknown, and rows_unknown says why
            "files": actions.num_rows,
            "schema_version": dt.metadata().configuration.get("datahub.schemaVersion"),
            "partition_columns": dt.metadata().partition_columns,
        }
        if deleted is not None:
            info["deleted_rows"] = deleted  # by deletion vectors, not counted in rows
        if unknown is not None:
            info["rows_unknown"] = unknown
        if table:
            info["schema"] = [{"name": f.name, "type": str(f.type)} for f in pa.schema(dt.schema().to_arrow())]
            info["history"] = [
                # timestamp: Delta's epoch milliseconds, as before; time: the same as ISO 8601 UTC (the JSON's format)
                {"version": h.get("version"), "operation": h.get("operation"), "timestamp": h.get("timestamp"),
                 "time": iso_utc_from_millis(h.get("timestamp")), "txn": h.get("datahub.txn")}
                for h in dt.history(10)
            ]
            if KIND_COLUMN in (field["name"] for field in info["schema"]):
                try:
                    info["kinds"] = kind_counts(lake, name, info["version"])
                except UnreadableVectors as error:  # the deleted positions of a mixed file: unknown, and why
                    info["kinds"], info["kinds_unknown"] = None, error.reason
        out["tables"][name] = info
    return out


class UnreadableVectors(LakeError):
    """Deletion vectors that had to be read (the deleted positions of a file of several kinds) could not be."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason = reason


def live_rows(lake: Lake, name: str, delta_table: Any, actions: pa.Table) -> tuple[int | None, int | None, str | None]:
    """The table's rows from the Delta log: (rows, rows deleted by deletion vectors or None without any, why rows
    are None when unknown).

    An add action's numRecords counts every row of its file, also those its deletion vector deletes (Spark and
    Databricks DELETE/UPDATE/MERGE with ``delta.enableDeletionVectors``); the vector's ``cardinality`` in the log
    says how many (``delta_log.deleted_row_counts``), so no vector is read and memory stays O(files). Unknown,
    rather than a wrong count, when a file's numRecords is missing (written without statistics), or when the log
    cannot be replayed here and a vector cannot be read."""
    counts = actions.column("num_records") if actions.num_rows else pa.array([], pa.int64())
    if counts.null_count:
        return None, None, (f"{counts.null_count} of its {len(counts)} data files have no row count in the Delta "
                            "log (written without statistics); count the rows with a reader of the table")
    total = int(pc.sum(counts).as_py() or 0)
    if not _has_deletion_vectors(delta_table, actions):
        return total, None, None
    try:
        deleted = sum(deleted_counts(lake, name, delta_table, actions.column("path").to_pylist()).values())
    except UnreadableVectors as error:
        return None, None, error.reason
    return total - deleted, deleted, None


def deleted_counts(lake: Lake, name: str, delta_table: Any, paths: list[str]) -> dict[str, int]:
    """Rows deleted by each data file's vector, by path: from the log's ``cardinality``; where the log cannot be
    replayed here (another store, a V2 checkpoint only), from the decoded vectors (a flag per row of those files)."""
    try:
        return deleted_row_counts(lake, name, delta_table.version(), paths)
    except LakeError as error:  # any failure to read or parse the log, too: counted another way
        log_error = error
    try:
        return {path: len(positions) for path, positions in deleted_positions(delta_table, paths).items()}
    except Exception as error:  # noqa: BLE001 - deltalake's reason is shown; nothing is counted
        raise UnreadableVectors(f"{lake.table_uri(name)}: {name}",
                                f"{_unreadable_vectors(error)}; nor could the Delta log give their counts: "
                                f"{log_error}") from error


def kind_counts(lake: Lake, table: str, version: int | None = None) -> dict[str, int]:
    """Rows of ``table`` (at ``version``) per sample kind, a null kind counted as text (``kinds.names``), most
    first. A data file whose Delta statistics show one kind (min == max, with its null count: text) or only nulls
    is counted from the log; only the other files' ``kind`` column is read, a batch at a time (a count per distinct
    kind is all that is held), so a table of files written per kind reads no data file.

    Deletion vectors (Spark/Databricks DELETE with ``delta.enableDeletionVectors``): a file's numRecords and null
    counts include the rows its vector deletes: a file of one kind counts its rows less its vector's cardinality
    (from the log, no vector read); only a file of several kinds with a vector has its vector read
    (``deleted_positions``) and its kind column read with those positions left out. A vector that cannot be read
    is ``UnreadableVectors`` (a ``LakeError``) naming the table: no count is made up."""
    counts: dict[str, int] = {}

    def add(kind: str, rows: int) -> None:
        if rows:
            counts[kind] = counts.get(kind, 0) + rows

    delta_table = lake.table(table, version)
    actions = pa.table(delta_table.get_add_actions(flatten=True))

    def column(name: str) -> list[Any]:
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    stored = _stored_kind_column(delta_table)  # its name in the files, the log's statistics and partition values
    partitioned = f"partition.{stored}" in actions.column_names
    partition_kind: dict[str, str] = {}  # a mixed file of a partitioned table: its kind (not a column of its file)
    deleted: dict[str, int] = {}  # data file (as the log names it) -> rows its vector deletes
    has_vectors = _has_deletion_vectors(delta_table, actions)  # the feature, maybe no vector yet: no scan either
    if has_vectors:
        deleted = deleted_counts(lake, table, delta_table, column("path"))
    mixed: list[str] = []
    for path, rows, value, nulls, low, high in zip(
            column("path"), column("num_records"), column(f"partition.{stored}"),
            column(f"null_count.{stored}"), column(f"min.{stored}"), column(f"max.{stored}")):
        gone = deleted.get(path, 0)
        if rows is not None and partitioned:  # one kind per file: its partition value
            add(DEFAULT_KIND if value is None else str(value), rows - gone)
        elif rows is not None and nulls is not None and nulls == rows:
            add(DEFAULT_KIND, rows - gone)
        elif rows is not None and nulls is not None and _one_value(low, high) and (nulls == 0 or not gone):
            add(DEFAULT_KIND, nulls)
            add(str(low), rows - nulls - gone)
        else:  # several kinds, no statistics (another writer, or written before the kind column), or deleted rows
            if partitioned:
                partition_kind[path] = DEFAULT_KIND if value is None else str(value)
            mixed.append(path)  # of a file of a kind and nulls: which of them went is in the file
    if mixed and has_vectors:  # delta-rs refuses to scan such a table: its files are read one by one, in row order
        vectored = [path for path in mixed if path in deleted]  # only these files' vectors are decoded
        try:
            positions = deleted_positions(delta_table, vectored) if vectored else {}
        except Exception as error:  # noqa: BLE001 - deltalake's reason is shown; nothing is counted
            raise UnreadableVectors(f"{lake.table_uri(table)}: {table}", _unreadable_vectors(error)) from error
        for path in mixed:
            if path in deleted and len(positions.get(path, [])) != deleted[path]:  # this table's kinds: unknown
                raise UnreadableVectors(f"{lake.table_uri(table)}: {table}",
                                        f"the deletion vector of {path} deletes {len(positions.get(path, []))} rows, "
                                        f"the log says {deleted[path]}: the table's log and vectors disagree")
            for kind, rows in _file_kinds(lake, table, path, positions.get(path), column=stored,
                                          kind=partition_kind.get(path)).items():
                add(kind, rows)
    elif mixed:
        dataset = lake.dataset(table, version)
        present = {fragment.path for fragment in dataset.get_fragments()}
        files: list[str] | None = [path if path in present else unquote(path) for path in mixed]
        if not present.issuperset(files or []):  # the scan names a file otherwise than the log
            counts.clear()
            files = None
        for batch in scan_batches(dataset, columns=[KIND_COLUMN], batch_rows=KIND_BATCH_ROWS, files=files):
            kinds = pc.fill_null(batch.column(0).cast(pa.string()), DEFAULT_KIND)
            for entry in pc.value_counts(kinds).to_pylist():
                add(entry["values"], entry["counts"])
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def deleted_positions(delta_table: Any, paths: list[str]) -> dict[str, pa.Array]:
    """The row positions each of ``paths``' deletion vector deletes, by the file's path as the add actions name it
    (``DeltaTable.deletion_vectors`` gives fully qualified URIs and a keep-mask; files without a vector and files
    not in ``paths`` are left out, so only the positions of ``paths`` are kept). Reads the vectors (inline in the
    log, or their own small files); raises what deltalake raises."""
    by_name = {unquote(path): path for path in paths}
    root = unquote(str(delta_table.table_uri)).rstrip("/") + "/"
    out: dict[str, pa.Array] = {}
    for batch in delta_table.deletion_vectors():
        batch = pa.record_batch(batch)
        for uri, keep in zip(batch.column("filepath").to_pylist(), batch.column("selection_vector")):
            name = unquote(uri)
            path = by_name.get(name.removeprefix(root)) or next(  # a root spelt otherwise (file:/// or not)
                (by_name[n] for n in by_name if name.endswith("/" + n)), None)
            if path is None:  # not asked for
                continue
            mask = pc.invert(keep.values)
            out[path] = pc.indices_nonzero(mask)
    return out


def _file_kinds(lake: Lake, table: str, path: str, gone: pa.Array | None, *, column: str = KIND_COLUMN,
                kind: str | None = None) -> dict[str, int]:
    """Rows per kind of one data file, the positions in ``gone`` left out; its kind column (stored as ``column``)
    only, a batch at a time. ``kind``: the file's partition value (a partition column is not in the file)."""
    import numpy as np
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    dead = np.sort(np.asarray(gone, dtype=np.int64)) if gone is not None else np.empty(0, np.int64)
    with lake.data_file(table, unquote(path)) as handle:
        parquet = pq.ParquetFile(handle)
        if kind is not None or column not in parquet.schema_arrow.names:  # else written before the kind column
            alive = parquet.metadata.num_rows - len(dead)
            return {kind or DEFAULT_KIND: alive} if alive else {}
        start = 0
        for batch in parquet.iter_batches(batch_size=KIND_BATCH_ROWS, columns=[column], use_threads=False):
            kinds = pc.fill_null(batch.column(0).cast(pa.string()), DEFAULT_KIND)
            low, high = np.searchsorted(dead, [start, start + batch.num_rows])
            if high > low:  # positions in the file -> in this batch
                keep = np.ones(batch.num_rows, dtype=bool)
                keep[dead[low:high] - start] = False
                kinds = kinds.filter(pa.array(keep))
            start += batch.num_rows
            for entry in pc.value_counts(kinds).to_pylist():
                counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return counts


def _unreadable_vectors(error: BaseException) -> str:
    text = str(error).strip()
    return ("the table has deletion vectors (rows deleted without rewriting their files) and they could not be read: "
            + (text.splitlines()[0] if text else type(error).__name__))


STATS_PREFIX_CHARS = 32  # writers may truncate string statistics to a prefix (Spark's dataSkippingStringPrefixLength)


def _one_value(low: object, high: object) -> bool:
    """Whether a file's min and max show one value: equal strings shorter than any truncated statistic."""
    return isinstance(low, str) and low == high and len(low) < STATS_PREFIX_CHARS


def _stored_kind_column(delta_table: Any) -> str:
    """The kind column's name in the data files and the log: its physical name under column mapping (name or id
    mode, common on Databricks: ``col-<uuid>``), else ``kind``."""
    if delta_table.metadata().configuration.get("delta.columnMapping.mode", "none") == "none":
        return KIND_COLUMN
    for field in delta_table.schema().fields:
        if field.name == KIND_COLUMN:
            return str(field.metadata.get("delta.columnMapping.physicalName") or KIND_COLUMN)
    return KIND_COLUMN


def _has_deletion_vectors(delta_table: Any, actions: pa.Table) -> bool:
    """Whether rows of the table may be deleted by deletion vectors: its protocol has the reader feature, or an add
    action carries a vector (a column deltalake may expose as ``deletionVector...``)."""
    if "deletionVectors" in (delta_table.protocol().reader_features or []):
        return True
    return any("deletion" in name.lower() and actions.column(name).null_count < actions.num_rows
               for name in actions.column_names)

"""What a lake holds, from the Delta log: what ``datahub inspect`` shows, as a function."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN
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
        actions = dt.get_add_actions(flatten=True)
        rows = list(actions.column("num_records").to_pylist()) if actions.num_rows else []
        info: dict[str, Any] = {
            "version": dt.version(),
            "rows": int(sum(r or 0 for r in rows)),
            "files": actions.num_rows,
            "schema_version": dt.metadata().configuration.get("datahub.schemaVersion"),
            "partition_columns": dt.metadata().partition_columns,
        }
        if table:
            info["schema"] = [{"name": f.name, "type": str(f.type)} for f in pa.schema(dt.schema().to_arrow())]
            info["history"] = [
                # timestamp: Delta's epoch milliseconds, as before; time: the same as ISO 8601 UTC (the JSON's format)
                {"version": h.get("version"), "operation": h.get("operation"), "timestamp": h.get("timestamp"),
                 "time": iso_utc_from_millis(h.get("timestamp")), "txn": h.get("datahub.txn")}
                for h in dt.history(10)
            ]
            if KIND_COLUMN in (field["name"] for field in info["schema"]):
                info["kinds"] = kind_counts(lake, name, info["version"])
        out["tables"][name] = info
    return out


def kind_counts(lake: Lake, table: str, version: int | None = None) -> dict[str, int]:
    """Rows of ``table`` (at ``version``) per sample kind, a null kind counted as text (``kinds.names``), most
    first. A data file whose Delta statistics show one kind (min == max, with its null count: text) or only nulls
    is counted from the log; only the other files' ``kind`` column is read, a batch at a time (a count per distinct
    kind is all that is held), so a table of files written per kind reads no data file. A table with deletion vectors
    is never counted from the log (its statistics count deleted rows): it is scanned, and the scan refuses it."""
    counts: dict[str, int] = {}

    def add(kind: str, rows: int) -> None:
        if rows:
            counts[kind] = counts.get(kind, 0) + rows

    delta_table = lake.table(table, version)
    actions = pa.table(delta_table.get_add_actions(flatten=True))

    def column(name: str) -> list[Any]:
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    partitioned = f"partition.{KIND_COLUMN}" in actions.column_names
    # a file's numRecords and null counts include the rows its deletion vector deletes: such a table is read whole,
    # and the scan refuses it as it did before these counts came from the log (pyarrow cannot apply the vectors)
    deletion_vectors = _has_deletion_vectors(delta_table, actions)
    mixed: list[str] = []
    for path, rows, value, nulls, low, high in zip(
            column("path"), column("num_records"), column(f"partition.{KIND_COLUMN}"),
            column(f"null_count.{KIND_COLUMN}"), column(f"min.{KIND_COLUMN}"), column(f"max.{KIND_COLUMN}")):
        if deletion_vectors:
            mixed.append(path)
        elif rows is not None and partitioned:  # one kind per file: its partition value
            add(DEFAULT_KIND if value is None else str(value), rows)
        elif rows is not None and nulls is not None and (nulls == rows or _one_value(low, high)):
            add(DEFAULT_KIND, nulls)
            if nulls < rows:
                add(str(low), rows - nulls)
        else:  # several kinds, or no statistics (another writer, or written before the kind column)
            mixed.append(path)
    if mixed:
        dataset = lake.dataset(table, version)
        present = {fragment.path for fragment in dataset.get_fragments()}
        files: list[str] | None = [path if path in present else unquote(path) for path in mixed]
        if deletion_vectors or not present.issuperset(files or []):  # or the scan names a file otherwise than the log
            counts.clear()
            files = None
        for batch in scan_batches(dataset, columns=[KIND_COLUMN], batch_rows=KIND_BATCH_ROWS, files=files):
            kinds = pc.fill_null(batch.column(0).cast(pa.string()), DEFAULT_KIND)
            for entry in pc.value_counts(kinds).to_pylist():
                add(entry["values"], entry["counts"])
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


STATS_PREFIX_CHARS = 32  # writers may truncate string statistics to a prefix (Spark's dataSkippingStringPrefixLength)


def _one_value(low: object, high: object) -> bool:
    """Whether a file's min and max show one value: equal strings shorter than any truncated statistic."""
    return isinstance(low, str) and low == high and len(low) < STATS_PREFIX_CHARS


def _has_deletion_vectors(delta_table: Any, actions: pa.Table) -> bool:
    """Whether rows of the table may be deleted by deletion vectors: its protocol has the reader feature, or an add
    action carries a vector (a column deltalake may expose as ``deletionVector...``)."""
    if "deletionVectors" in (delta_table.protocol().reader_features or []):
        return True
    return any("deletion" in name.lower() and actions.column(name).null_count < actions.num_rows
               for name in actions.column_names)

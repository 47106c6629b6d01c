"""What a lake holds, from the Delta log: what ``datahub inspect`` shows, as a function."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds.names import DEFAULT_KIND, KIND_COLUMN
from datahub.lake.lake import Lake

KIND_BATCH_ROWS = 1 << 16  # rows of the kind column counted at a time


def describe_lake(lake: Lake, table: str | None = None) -> dict[str, Any]:
    """Describe a lake (every table) or one table: version, rows, files, schema, recent commits, and for one table
    with a ``kind`` column its rows per kind (``kind_counts``).

    From the Delta log only (add actions, metadata, history), except the per-kind counts of one table: a streamed
    pass over its ``kind`` column.
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
                {"version": h.get("version"), "operation": h.get("operation"), "timestamp": h.get("timestamp"),
                 "txn": h.get("datahub.txn")}
                for h in dt.history(10)
            ]
            if KIND_COLUMN in (field["name"] for field in info["schema"]):
                info["kinds"] = kind_counts(lake, name, info["version"])
        out["tables"][name] = info
    return out


def kind_counts(lake: Lake, table: str, version: int | None = None) -> dict[str, int]:
    """Rows of ``table`` (at ``version``) per sample kind, a null kind counted as text (``kinds.names``), most
    first: the ``kind`` column only, a batch at a time (a count per distinct kind is all that is held)."""
    counts: dict[str, int] = {}
    scanner = lake.dataset(table, version).scanner(columns=[KIND_COLUMN], batch_size=KIND_BATCH_ROWS)
    for batch in scanner.to_batches():
        if not batch.num_rows:
            continue
        kinds = pc.fill_null(batch.column(0).cast(pa.string()), DEFAULT_KIND)
        for entry in pc.value_counts(kinds).to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

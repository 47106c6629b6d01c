"""What a lake holds, from the Delta log: what ``datahub inspect`` shows, as a function."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from datahub.lake.lake import Lake


def describe_lake(lake: Lake, table: str | None = None) -> dict[str, Any]:
    """Describe a lake (every table) or one table: version, rows, files, schema, recent commits.

    From the Delta log only (add actions, metadata, history): no data file is read.
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
        out["tables"][name] = info
    return out

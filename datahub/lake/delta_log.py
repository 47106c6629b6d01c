"""What the Delta log says that deltalake does not expose: the rows each data file's deletion vector deletes.

deltalake 1.6's ``get_add_actions`` leaves out ``add.deletionVector``, and its ``deletion_vectors()`` materialises a
flag per row of every file that has a vector. The protocol's ``deletionVector.cardinality`` (PROTOCOL.md, "Deletion
Vector Descriptor Schema") is the number of rows a vector deletes, so live rows are Σ numRecords − Σ cardinality,
read from the log's add actions: the newest complete checkpoint at or before the version (only its
``add.path`` and ``add.deletionVector.cardinality`` columns, a batch at a time), then the JSON commits after it (a
line at a time). Only the live files' counts are kept: memory grows with the number of files, not with rows.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any
from urllib.parse import unquote

from datahub.errors import LakeError
from datahub.lake.lake import Lake

_COMMIT = re.compile(r"^(\d{20})\.json$")
# classic checkpoints, one file or parts i of n; V2 checkpoints (a UUID, sidecars) are not read here
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_CHECKPOINT_BATCH_ROWS = 1 << 16


def deleted_row_counts(lake: Lake, table: str, version: int, live_paths: list[str]) -> dict[str, int]:
    """Rows deleted by each live data file's deletion vector (``cardinality``), by the file's path as
    ``live_paths`` (the add actions of ``version``) names it; files without a vector are left out. No vector is read.

    Raises ``LakeError`` when the log cannot be replayed here (a store other than local or s3://, commits removed
    before a checkpoint, a V2 checkpoint only, or a live file no add action names), and when a log file cannot be
    read or parsed (the store's error, a commit removed by log cleanup while it is read, a half-written checkpoint,
    bad JSON): the caller falls back to another way of counting, or says why the rows are unknown."""
    try:
        return _replay(lake, table, version, live_paths)
    except LakeError:
        raise
    except Exception as error:  # noqa: BLE001 - any read or parse failure is "cannot replay", never a wrong count
        text = str(error).strip().splitlines()
        raise LakeError(f"{lake.table_uri(table)}/_delta_log: could not be read: {type(error).__name__}"
                        + (f": {text[0]}" if text else "")) from error


def _replay(lake: Lake, table: str, version: int, live_paths: list[str]) -> dict[str, int]:
    names = lake.log_names(table)
    commits = {int(m.group(1)) for m in map(_COMMIT.match, names) if m}
    parts: dict[int, dict[int, set[str]]] = {}  # version -> parts count -> files
    for name in names:
        match = _CHECKPOINT.match(name)
        if match and int(match.group(1)) <= version:
            parts.setdefault(int(match.group(1)), {}).setdefault(int(match.group(3) or 1), set()).add(name)
    start, checkpoint_files = 0, []
    for at in sorted(parts, reverse=True):
        complete = [sorted(files) for count, files in parts[at].items() if len(files) == count]
        if complete:
            start, checkpoint_files = at + 1, complete[0]
            break
    missing = [v for v in range(start, version + 1) if v not in commits]
    if missing:
        raise LakeError(f"{lake.table_uri(table)}/_delta_log: commit {missing[0]} is missing and no checkpoint before "
                        "it could be read")
    wanted = {unquote(path) for path in live_paths}  # only the live files' adds are kept: O(live files)
    cardinality: dict[str, int] = {}  # unquoted live path -> rows its vector deletes (0: no vector)
    for name in checkpoint_files:
        _read_checkpoint(lake, table, name, wanted, cardinality)
    for at in range(start, version + 1):
        with lake.data_file(table, f"_delta_log/{at:020d}.json") as handle:
            for line in io.TextIOWrapper(handle, encoding="utf-8"):  # a line (an action) at a time
                if '"add"' not in line:
                    continue
                add = json.loads(line).get("add")
                added = unquote(add["path"]) if add else None
                if added in wanted:  # the last add of a path wins (a DV update re-adds it)
                    cardinality[added] = int((add.get("deletionVector") or {}).get("cardinality") or 0)
    out: dict[str, int] = {}
    for path in live_paths:
        name = unquote(path)
        if name not in cardinality:
            raise LakeError(f"{lake.table_uri(table)}/_delta_log: no add action names the live file {path}")
        if cardinality[name]:
            out[path] = cardinality[name]
    return out


def _read_checkpoint(lake: Lake, table: str, name: str, wanted: set[str], cardinality: dict[str, int]) -> None:
    import pyarrow.parquet as pq

    with lake.data_file(table, f"_delta_log/{name}") as handle:
        parquet = pq.ParquetFile(handle)
        add = parquet.schema_arrow.field("add").type if "add" in parquet.schema_arrow.names else None
        if add is None:
            return
        has_vectors = add.get_field_index("deletionVector") >= 0
        columns = ["add.path"] + (["add.deletionVector.cardinality"] if has_vectors else [])
        for batch in parquet.iter_batches(batch_size=_CHECKPOINT_BATCH_ROWS, columns=columns, use_threads=False):
            adds = _children(batch.column("add"))  # by name; the add's nulls (other actions' rows) carried into them
            paths = adds["path"].to_pylist()
            counts = (_children(adds["deletionVector"])["cardinality"].to_pylist() if has_vectors
                      else [None] * len(paths))
            for path, count in zip(paths, counts):
                unquoted = unquote(path) if path is not None else None
                if unquoted in wanted:
                    cardinality[unquoted] = int(count or 0)


def _children(struct: Any) -> dict[str, Any]:
    """A struct column's fields by name, each with the struct's own nulls (``flatten``)."""
    return {field.name: child for field, child in zip(struct.type, struct.flatten())}

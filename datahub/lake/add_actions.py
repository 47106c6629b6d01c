"""Commit Parquet files that executors already wrote into a table's folder, as one Delta commit.

The Spark path of DESIGN.md: executors write Parquet (``SparkFrame.write_parquet``), the
driver commits the files with deltalake ``AddAction``s carrying the run's app transaction,
so a re-run of the same ``txn`` is a no-op exactly like ``Lake.commit``. No delta-spark, no
jars. Files of a crashed run that never got committed are unreferenced and removed by vacuum.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from datahub.errors import CommitConflictError, LakeError
from datahub.lake.tables import SCHEMA_VERSION, SCHEMA_VERSION_PROPERTY

if TYPE_CHECKING:
    from datahub.lake.lake import Lake


@dataclass(frozen=True)
class DataFile:
    """One Parquet file written for a table: where, how big, how many rows, Delta stats JSON."""

    uri: str
    size: int
    rows: int
    stats: str = "{}"
    partition_values: Mapping[str, str | None] = field(default_factory=dict)


def relative_path(table_uri: str, file_uri: str) -> str:
    """The path of ``file_uri`` relative to the table root (Delta add actions are relative)."""
    root, uri = _strip_scheme(table_uri).rstrip("/") + "/", _strip_scheme(file_uri)
    if not uri.startswith(root):
        raise LakeError(
            f"{file_uri}: a data file must lie inside its table folder {table_uri}; "
            "write the Parquet files into lake.table_uri(name)"
        )
    return uri[len(root):]


def _strip_scheme(uri: str) -> str:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri


def commit_files(
    lake: Lake,
    name: str,
    files: Sequence[DataFile],
    *,
    schema: pa.Schema,
    txn: str,
    mode: Literal["append", "overwrite"] = "append",
    metadata: Mapping[str, Any] | None = None,
    partition_by: list[str] | None = None,
    max_retries: int = 5,
) -> int | None:
    """Add ``files`` to table ``name`` in one commit tagged with app transaction ``txn``.

    Returns the new version, or None when ``txn`` was committed before (no-op). Creates the
    table with ``schema`` when it does not exist yet.
    """
    from deltalake import CommitProperties, Transaction
    from deltalake import Schema as DeltaSchema
    from deltalake.exceptions import CommitFailedError, DeltaError
    from deltalake.transaction import AddAction, create_table_with_add_actions

    if lake.applied(name, txn):
        return None
    table_uri = lake.table_uri(name)
    now = int(time.time() * 1000)
    actions = [
        AddAction(
            path=relative_path(table_uri, f.uri),
            size=f.size,
            partition_values=dict(f.partition_values),
            modification_time=now,
            data_change=True,
            stats=f.stats,
        )
        for f in files
    ]
    custom = {"datahub.txn": txn, **{k: v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in (metadata or {}).items()}}
    props = CommitProperties(
        custom_metadata=custom,
        app_transactions=[Transaction(app_id=txn, version=1, last_updated=now)],
        max_commit_retries=max_retries,
    )
    storage = lake.storage_options or None
    try:
        if lake.exists(name):
            lake.table(name).create_write_transaction(actions, mode, schema, partition_by=partition_by, commit_properties=props)
        else:
            try:
                create_table_with_add_actions(
                    table_uri, DeltaSchema.from_arrow(schema), actions, mode="error",
                    partition_by=partition_by, storage_options=storage, commit_properties=props,
                )
            except DeltaError:
                if not lake.exists(name):
                    raise
                # another writer created the table between our check and our commit: append instead
                if lake.applied(name, txn):
                    return None
                lake.table(name).create_write_transaction(actions, mode, schema, partition_by=partition_by, commit_properties=props)
    except CommitFailedError as exc:
        if lake.applied(name, txn):  # a concurrent writer of the same txn won the race
            return None
        raise CommitConflictError(f"{table_uri}: commit {txn} of {len(actions)} files failed: {exc}") from exc
    table = lake.table(name)
    if table.metadata().configuration.get(SCHEMA_VERSION_PROPERTY) is None:
        table.alter.set_table_properties({SCHEMA_VERSION_PROPERTY: SCHEMA_VERSION}, raise_if_not_exists=False)
        table = lake.table(name)
    return int(table.version())


def commit_frame(
    lake: Lake,
    name: str,
    frame: Any,
    *,
    txn: str,
    mode: Literal["append", "overwrite"] = "append",
    metadata: Mapping[str, Any] | None = None,
) -> int | None:
    """Executors write ``frame`` (a SparkFrame) as Parquet into the table folder; the driver commits it.

    Skips all work when ``txn`` is already in the table.
    """
    if lake.applied(name, txn):
        return None
    slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in txn)[:80]
    files = frame.write_parquet(lake.table_uri(name), storage_options=lake.storage_options, prefix=f"part-{slug}")
    return commit_files(lake, name, files, schema=frame.delta_schema(), txn=txn, mode=mode, metadata=metadata)

"""Commit Parquet files that executors already wrote into a table's folder, as one Delta commit.

Files written by workers (Spark's executors, any engine's tasks through ``datahub.engines.sink``;
docs/design.md, Engines) are committed here, by the driver, as deltalake ``AddAction``s carrying the
run's app transaction, so a re-run of the same ``txn`` is a no-op exactly like ``Lake.commit``. No
delta-spark, no jars. Files of a crashed run that never got committed are unreferenced: no Delta reader sees
them, and vacuum removes them.

A commit never hides columns: ``create_write_transaction`` keeps the table's schema as it is,
so when the new files bring columns or struct fields the table lacks, a schema-only commit
(no rows, ``Lake.commit`` with schema merge, txn ``{txn}/schema``) comes first.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from datahub.errors import CommitConflictError, LakeError
from datahub.retry import retry_policy, storage_errors

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


def txn_slug(txn: str) -> str:
    """``txn`` as a safe file-name part (data files of a run are named after it)."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in txn)[:80]


@dataclass(frozen=True)
class StagedFiles:
    """Parquet files already written into a table's folder, not committed yet (no reader sees them).

    ``commit`` is ``datahub.pipeline.sinks.staging.Staged.commit`` for files written by workers.
    """

    files: tuple[DataFile, ...]
    schema: pa.Schema

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def commit(self, lake: Lake, table: str, *, txn: str, metadata: Mapping[str, Any] | None = None,
               empty_schema: pa.Schema | None = None, replace: str | None = None) -> int | None:
        if replace is not None:
            raise LakeError(
                f"{lake.table_uri(table)}: files written by workers can only be appended, not replace rows "
                f"matching {replace!r}; stream the rows to the driver and use Lake.commit(mode='overwrite', predicate=...)"
            )
        if not self.files and (empty_schema is None or lake.exists(table)):
            return None
        return commit_files(lake, table, self.files, schema=self.schema, txn=txn, metadata=metadata)


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
    table with ``schema`` when it does not exist yet; adds the columns of ``schema`` it lacks
    first. Transient storage errors are retried (the txn check makes a retry idempotent).
    """

    def attempt() -> int | None:
        with storage_errors(f"commit {txn} ({len(files)} files) to {lake.table_uri(name)}"):
            return _commit_files_once(lake, name, files, schema=schema, txn=txn, mode=mode, metadata=metadata,
                                      partition_by=partition_by, max_retries=max_retries)

    return retry_policy(attempt, lake.retry)


def _commit_files_once(lake: Lake, name: str, files: Sequence[DataFile], *, schema: pa.Schema, txn: str,
                       mode: Literal["append", "overwrite"], metadata: Mapping[str, Any] | None,
                       partition_by: list[str] | None, max_retries: int) -> int | None:
    from deltalake import CommitProperties, PostCommitHookProperties, Transaction
    from deltalake import Schema as DeltaSchema
    from deltalake.exceptions import CommitFailedError, DeltaError
    from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

    from datahub.lake.lake import KEEP_LOG

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
    changes: list[AddAction | RemoveAction] = list(actions)  # what create_write_transaction takes
    hooks = PostCommitHookProperties(cleanup_expired_logs=False)  # releases time-travel: keep the log (Lake.keep_log)
    storage = lake.storage_options or None
    try:
        if lake.exists(name):
            _add_missing_columns(lake, name, schema, txn=txn)
            lake.table(name).create_write_transaction(changes, mode, schema, partition_by=partition_by, commit_properties=props,
                                                      post_commithook_properties=hooks)
        else:
            try:
                create_table_with_add_actions(
                    table_uri, DeltaSchema.from_arrow(schema), actions, mode="error", partition_by=partition_by,
                    configuration=KEEP_LOG, storage_options=storage, commit_properties=props, post_commithook_properties=hooks,
                )
            except DeltaError:
                if not lake.exists(name):
                    raise
                # another writer created the table between our check and our commit: append instead
                if lake.applied(name, txn):
                    return None
                _add_missing_columns(lake, name, schema, txn=txn)
                lake.table(name).create_write_transaction(changes, mode, schema, partition_by=partition_by, commit_properties=props,
                                                          post_commithook_properties=hooks)
    except CommitFailedError as exc:
        if lake.applied(name, txn):  # a concurrent writer of the same txn won the race
            return None
        raise CommitConflictError(f"{table_uri}: commit {txn} of {len(actions)} files failed: {exc}") from exc
    return int(lake.keep_log(name).version())  # schema version and log retention, as Lake.commit


def _add_missing_columns(lake: Lake, name: str, schema: pa.Schema, *, txn: str) -> None:
    """Merge ``schema`` into the table's schema when it brings new columns or struct fields (no rows)."""
    current = pa.schema(lake.table(name).schema().to_arrow())
    if field_paths(schema) <= field_paths(current):
        return
    # one try: commit_files retries its whole attempt, schema merge included (nested retries would multiply)
    lake.commit(name, schema.empty_table(), txn=f"{txn}/schema", metadata={"datahub.schema_merge": True}, retry=False)


def field_paths(schema: pa.Schema) -> set[str]:
    """Every column and nested struct field as a dotted path (``quality.score``)."""

    def walk(prefix: str, fields: Any) -> set[str]:
        out: set[str] = set()
        for f in fields:
            path = prefix + f.name
            out.add(path)
            if pa.types.is_struct(f.type):
                out |= walk(path + ".", f.type)
        return out

    return walk("", schema)


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
    files = frame.write_parquet(lake.table_uri(name), storage_options=lake.storage_options, prefix=f"part-{txn_slug(txn)}")
    return commit_files(lake, name, files, schema=frame.delta_schema(), txn=txn, mode=mode, metadata=metadata)

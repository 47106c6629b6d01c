"""The lake: one Delta table per name under one root (a local path or s3://...).

Every write is one commit carrying an app transaction id (docs/design.md, Contracts): committing the same
``txn`` to the same table again is a no-op, so a crashed run can be re-run safely.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

import pyarrow as pa

from datahub.close_names import did_you_mean
from datahub.errors import CommitConflictError, LakeError
from datahub.lake.tables import SCHEMA_VERSION, SCHEMA_VERSION_PROPERTY
from datahub.retry import DEFAULT_POLICY, RetryPolicy, retry_policy, storage_errors

if TYPE_CHECKING:
    from deltalake import DeltaTable

WriteData: TypeAlias = "pa.Table | pa.RecordBatchReader | Iterable[pa.Table]"

# Tables looked up by one key: every commit is sorted by it and written in small row groups,
# so a one-sample lookup reads one row group per file (file and row-group min/max skipping).
SORTED_LAYOUT: dict[str, tuple[str, int]] = {"lineage": ("sample_id", 32_768)}
TABLES_NAMED = 20  # tables listed in the error about a missing one (a lake holds a release_<NAME> per merge/redact)

# A streamed commit (a RecordBatchReader, e.g. a run's staged samples) is written in row groups and
# files of these sizes, so the writer's memory stays bounded whatever the stream's length (with
# delta-rs's defaults, 1M-row groups and ~100 MB files, committing 1M short samples took 900 MB).
STREAM_ROW_GROUP_ROWS = 32_768
STREAM_FILE_BYTES = 32 * 2**20
# Parquet settings of every file the lake writes, delta-rs (``writer_properties``) and pyarrow (``datahub.lake.files``)
# alike. delta-rs compresses with Snappy only when given no WriterProperties: properties naming only the row group
# size wrote UNCOMPRESSED files (every streamed commit, lineage, merge, redact), 2-3x the bytes of text the engines'
# pyarrow files hold. A page's size is checked every PAGE_CHECK_ROWS values (both writers' default is 1,024): a
# reader decodes at least a whole page, so 1,024 agent trajectories of ~250 KB made one 250 MB page.
COMPRESSION: Final = "SNAPPY"
PAGE_CHECK_ROWS = 64

# Releases freeze a Delta version and read it back by time travel, so no table may lose log
# entries implicitly. deltalake (checked on 1.6.6: transaction.PostCommitHookProperties) runs a
# post-commit hook after each checkpoint (every delta.checkpointInterval = 100 commits) that
# deletes log files older than delta.logRetentionDuration (30 days) unless
# delta.enableExpiredLogCleanup is "false"; versions before the oldest kept checkpoint then fail
# with "No files in log segment". Every lake table carries this property and every datahub
# commit also turns the hook's cleanup off, so only an explicit vacuum removes old versions
# (``datahub release vacuum``, which refuses to break a release).
KEEP_LOG_PROPERTY = "delta.enableExpiredLogCleanup"
KEEP_LOG = {KEEP_LOG_PROPERTY: "false"}
# One commit at a time per process, from the txn check to the table-property step. A write pulls its
# rows through a Python reader on delta-rs's runtime threads, which need the GIL, while
# set_table_properties waits on that runtime holding the GIL: threads of one process committing at
# once hung (CI, tests/release/test_events.py::test_racing_archivers_make_one_event). Holding it from
# the txn check on also lets a thread see the txn another thread just committed. Separate processes
# are unaffected (delta-rs's optimistic commits and the txn check order them).
_COMMIT_LOCK = threading.RLock()


class Lake:
    """A lake root plus the storage options needed to reach it (no global state)."""

    def __init__(self, root: str | os.PathLike[str], *, storage_options: Mapping[str, str] | None = None,
                 retry: RetryPolicy = DEFAULT_POLICY) -> None:
        root = os.fspath(root)
        self.retry = retry  # transient storage errors in read/commit are retried with backoff
        if "://" not in root:
            root = os.path.abspath(root)
        self.root = root.rstrip("/")
        self.storage_options: dict[str, str] = dict(storage_options or {})
        # what a pasted command's --lake should say: the root, or the lake YAML it was opened from (which
        # carries the storage options a bare root would lack); set by datahub.cli.lake_option.open_lake
        self.ref = self.root

    def __repr__(self) -> str:
        return f"Lake({self.root!r})"

    @property
    def is_local(self) -> bool:
        return "://" not in self.root or self.root.startswith("file://")

    def table_uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def exists(self, name: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.table_uri(name), storage_options=self.storage_options or None)

    def table(self, name: str, version: int | None = None) -> DeltaTable:
        """The ``deltalake.DeltaTable`` for ``name`` (at ``version`` if given)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        if version is not None and version < 0:
            raise LakeError(f"{self.table_uri(name)}: no version {version} of table {name!r}; versions count from 0")
        try:
            return DeltaTable(self.table_uri(name), version=version, storage_options=self.storage_options or None)
        except TableNotFoundError:
            raise LakeError(self._no_table(name)) from None
        except DeltaError:
            # delta-rs says "LogSegment end version 1 not the same as the specified end version 9"
            try:
                latest = self.table(name).version() if version is not None else None
            except (DeltaError, LakeError):  # the table itself cannot be opened: the first error says why
                latest = None
            if latest is not None and version is not None and version > latest:
                raise LakeError(f"{self.table_uri(name)}: no version {version} of table {name!r}; its latest is "
                                f"{latest} (datahub inspect --lake {shlex.quote(str(self.ref))} {name} shows it)") from None
            raise

    def _no_table(self, name: str) -> str:
        """The error for a table ``name`` the lake lacks: a typo (``sample``) gets the lake's tables and the closest
        names; an empty lake, the job that would write it."""
        from deltalake.exceptions import DeltaError

        try:
            known = self.tables()
        except (OSError, DeltaError):  # the listing failing must not hide the missing table
            known = []
        where = f"{self.table_uri(name)}: no Delta table {name!r} in lake {self.root}"
        if not known:
            return f"{where}; run a job that writes it first (datahub run JOB.yaml)"
        shown = ", ".join(known[:TABLES_NAMED]) + (f" and {len(known) - TABLES_NAMED} more" if len(known) > TABLES_NAMED
                                                   else "")
        return f"{where}{did_you_mean(name, known)} (its tables: {shown}; datahub inspect --lake {shlex.quote(str(self.ref))})"

    def tables(self) -> list[str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.root, **_fsspec_options(self.storage_options))
        if not fs.exists(path):
            return []
        names = []
        for entry in sorted(fs.ls(path, detail=False)):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith("_") and self.exists(name):
                names.append(name)
        return names

    def dataset(self, name: str, version: int | None = None, *, file_pruning_predicate: Any = None) -> Any:
        """Table ``name`` (at ``version``) as a ``pyarrow.dataset.Dataset``, files pruned by the predicate.

        The scan reads through pyarrow's own filesystems (local, or s3fs for ``s3://``), not
        delta-rs's object_store handler: with that handler inside pyarrow's scan threads the
        process aborted at exit ("terminate called without an active exception", delta-rs #2184)
        in about a third of short CLI runs here.
        """
        table = self.table(name, version)
        return table.to_pyarrow_dataset(filesystem=self._scan_filesystem(name),
                                        file_pruning_predicate=file_pruning_predicate)

    def data_file(self, name: str, path: str) -> Any:
        """One data file of table ``name`` (``path`` relative to the table, unquoted) opened for reading, through
        the filesystem ``dataset`` scans with: for a reader that must read files itself, e.g. to apply deletion
        vectors, which delta-rs refuses to read. A context manager (a pyarrow ``NativeFile``)."""
        filesystem = self._scan_filesystem(name)
        if filesystem is None:
            raise LakeError(f"{self.table_uri(name)}: its data files can be read directly only on a local or s3:// "
                            "lake")
        return filesystem.open_input_file(path)

    def log_names(self, name: str) -> list[str]:
        """The file names in table ``name``'s ``_delta_log`` folder (read with ``data_file``), for a reader of the
        log itself; local or s3:// lakes only, as ``data_file``."""
        import pyarrow.fs as pa_fs

        filesystem = self._scan_filesystem(name)
        if filesystem is None:
            raise LakeError(f"{self.table_uri(name)}: its Delta log can be read directly only on a local or s3:// "
                            "lake")
        selector = pa_fs.FileSelector("_delta_log", allow_not_found=True)
        return [info.base_name for info in filesystem.get_file_info(selector) if info.type == pa_fs.FileType.File]

    def _scan_filesystem(self, name: str) -> Any:
        import pyarrow.fs as pa_fs

        uri = self.table_uri(name)
        if "://" not in uri or uri.startswith("file://"):
            return pa_fs.SubTreeFileSystem(uri.removeprefix("file://"), pa_fs.LocalFileSystem())
        if uri.startswith(("s3://", "s3a://")):
            import fsspec

            fs, path = fsspec.core.url_to_fs(uri.replace("s3a://", "s3://", 1), **_fsspec_options(self.storage_options))
            return pa_fs.SubTreeFileSystem(path, pa_fs.PyFileSystem(pa_fs.FSSpecHandler(fs)))
        return None  # other stores (hdfs://, ...): delta-rs's handler

    def version(self, name: str) -> int | None:
        return self.table(name).version() if self.exists(name) else None

    def read(
        self,
        name: str,
        *,
        version: int | None = None,
        columns: list[str] | None = None,
        filters: Any = None,
    ) -> pa.Table:
        """Read a table (or an empty table when it does not exist yet and ``version`` is None)."""

        def attempt() -> pa.Table:
            with storage_errors(f"read {self.table_uri(name)}"):
                if version is None and not self.exists(name):
                    return pa.table({})
                try:
                    return self.dataset(name, version).to_table(columns=columns, filter=filters)
                except FileNotFoundError as exc:
                    at = f" version {version}" if version is not None else ""
                    raise LakeError(f"{self.table_uri(name)}{at}: a data file was not found ({exc}); it was deleted "
                                    "(`datahub release vacuum`, or by hand) or the storage lost it") from None

        return retry_policy(attempt, self.retry)

    def applied(self, name: str, txn: str) -> bool:
        """True when a commit with app transaction ``txn`` is already in table ``name``."""
        return self.exists(name) and self.table(name).transaction_version(txn) is not None

    def commit(
        self,
        name: str,
        data: WriteData,
        *,
        txn: str,
        schema: pa.Schema | None = None,
        mode: Literal["append", "overwrite"] = "append",
        metadata: Mapping[str, Any] | None = None,
        partition_by: list[str] | None = None,
        predicate: str | None = None,
        row_group_rows: int | None = None,
        max_retries: int = 5,
        retry: bool = True,
    ) -> int | None:
        """Write ``data`` to table ``name`` as exactly one commit tagged with ``txn``.

        Returns the new table version, or None when ``txn`` was committed before (no-op).
        Concurrent appends by other writers are retried (Delta optimistic concurrency).
        ``mode="overwrite"`` with a ``predicate`` (SQL) replaces only the matching rows.
        ``row_group_rows`` caps Parquet row groups, so readers filtering on a sorted column skip more.
        Transient storage errors are retried with backoff when ``data`` is a ``pa.Table``
        (a stream cannot be replayed) and ``retry`` (False: a caller that retries the whole step itself);
        the txn check makes a retried commit idempotent.
        """
        attempts = self.retry if retry and isinstance(data, pa.Table) else RetryPolicy(attempts=1)

        def attempt() -> int | None:
            with storage_errors(f"commit {txn} to {self.table_uri(name)}"), _COMMIT_LOCK:
                return self._commit_once(name, data, txn=txn, schema=schema, mode=mode, metadata=metadata,
                                         partition_by=partition_by, predicate=predicate, max_retries=max_retries,
                                         row_group_rows=row_group_rows)

        return retry_policy(attempt, attempts)

    def _commit_once(self, name: str, data: WriteData, *, txn: str, schema: pa.Schema | None,
                     mode: Literal["append", "overwrite"],
                     metadata: Mapping[str, Any] | None, partition_by: list[str] | None, predicate: str | None,
                     max_retries: int, row_group_rows: int | None) -> int | None:
        from deltalake import CommitProperties, PostCommitHookProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        if self.applied(name, txn):
            return None
        layout = SORTED_LAYOUT.get(name)
        if layout is not None and isinstance(data, pa.Table) and layout[0] in data.column_names:
            data = data.sort_by([(layout[0], "ascending")])
            row_group_rows = row_group_rows or layout[1]
        streamed = not isinstance(data, pa.Table)
        if streamed:  # delta-rs holds a whole row group, and a file up to target_file_size, in memory
            row_group_rows = row_group_rows or STREAM_ROW_GROUP_ROWS
        reader = _as_reader(data, schema)
        exists = self.exists(name)
        custom = {"datahub.txn": txn, **{k: _meta_value(v) for k, v in (metadata or {}).items()}}
        props = CommitProperties(
            custom_metadata=custom,
            app_transactions=[Transaction(app_id=txn, version=1, last_updated=int(time.time() * 1000))],
            max_commit_retries=max_retries,
        )
        # One dict for write_deltalake's overloads (which split on mode and predicate): mode and the
        # predicate are runtime values here, and None means "not given" for every option.
        options: dict[str, Any] = {
            "mode": mode,
            "predicate": predicate if exists else None,
            "schema_mode": "merge" if exists else None,
            "partition_by": None if exists else partition_by,
            "storage_options": self.storage_options or None,
            "commit_properties": props,
            "writer_properties": writer_properties(row_group_rows),
            "target_file_size": STREAM_FILE_BYTES if streamed else None,
            "configuration": None if exists else KEEP_LOG,
            "post_commithook_properties": PostCommitHookProperties(cleanup_expired_logs=False),
        }
        try:
            write_deltalake(self.table_uri(name), reader, **options)
        except CommitFailedError as exc:
            if self.applied(name, txn):  # a concurrent writer of the same txn won the race
                return None
            raise CommitConflictError(f"{self.table_uri(name)}: commit {txn} failed: {exc}") from exc
        # delta-rs refuses custom keys at create time; set them right after (also repairs a table
        # whose creator crashed between the two commits, or that predates KEEP_LOG).
        return int(self.keep_log(name).version())

    def keep_log(self, name: str) -> Any:
        """Make table ``name`` keep its whole Delta log and carry the schema version; returns the table.

        A no-op when both properties are set; otherwise one ``SET TBLPROPERTIES`` commit. Called
        after every commit and when a release freezes a table written by another writer.
        """
        from deltalake import PostCommitHookProperties
        from deltalake.exceptions import CommitFailedError

        for _ in range(5):
            table = self.table(name)
            configuration = table.metadata().configuration
            missing = {k: v for k, v in KEEP_LOG.items() if configuration.get(k) != v}
            if configuration.get(SCHEMA_VERSION_PROPERTY) is None:
                missing[SCHEMA_VERSION_PROPERTY] = SCHEMA_VERSION
            if not missing:
                return table
            try:
                with _COMMIT_LOCK:
                    table.alter.set_table_properties(
                        missing, raise_if_not_exists=False,
                        post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=False))
            except CommitFailedError:  # another writer committed meanwhile (maybe the same properties): look again
                continue
        raise CommitConflictError(f"{self.table_uri(name)}: could not set {sorted(missing)} after 5 tries, other "
                                  "writers kept committing; the data is committed, re-run to set them")

    def history(self, name: str, limit: int | None = None) -> list[dict[str, Any]]:
        return list(self.table(name).history(limit))

    def schema_version(self, name: str) -> str | None:
        return self.table(name).metadata().configuration.get(SCHEMA_VERSION_PROPERTY)


def writer_properties(row_group_rows: int | None = None) -> Any:
    """delta-rs's ``WriterProperties`` for a lake file: Snappy (as delta-rs without properties), a page's size
    checked every ``PAGE_CHECK_ROWS`` values, row groups of ``row_group_rows`` (delta-rs's default when None)."""
    from deltalake import WriterProperties

    return WriterProperties(compression=COMPRESSION, write_batch_size=PAGE_CHECK_ROWS, max_row_group_size=row_group_rows)


def _meta_value(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value, default=str)


def _as_reader(data: WriteData, schema: pa.Schema | None) -> pa.RecordBatchReader:
    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, pa.Table):
        table = data.cast(schema) if schema is not None and data.schema != schema else data
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    iterator = iter(data)
    first = None
    for first in iterator:
        if first.num_rows:
            break
    if first is None:
        if schema is None:
            raise LakeError("nothing to write and no schema given")
        return pa.RecordBatchReader.from_batches(schema, [])
    target = schema or first.schema

    def batches() -> Iterator[pa.RecordBatch]:
        for table in _chain(first, iterator):
            if table.num_rows:
                yield from table.cast(target).to_batches() if table.schema != target else table.to_batches()

    return pa.RecordBatchReader.from_batches(target, batches())


def _chain(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    yield from rest


def _fsspec_options(storage_options: Mapping[str, str]) -> dict[str, Any]:
    """Translate delta-rs style S3 options into s3fs keyword arguments."""
    if not storage_options:
        return {}
    lower = {k.lower(): v for k, v in storage_options.items()}
    out: dict[str, Any] = {}
    if "aws_access_key_id" in lower:
        out["key"] = lower["aws_access_key_id"]
    if "aws_secret_access_key" in lower:
        out["secret"] = lower["aws_secret_access_key"]
    client: dict[str, Any] = {}
    if "aws_endpoint_url" in lower:
        client["endpoint_url"] = lower["aws_endpoint_url"]
    if "aws_region" in lower:
        client["region_name"] = lower["aws_region"]
    if client:
        out["client_kwargs"] = client
    return out


fsspec_options = _fsspec_options

"""Dedup indexes in the lake, so a later run dedups against everything already kept.

- ``minhash_index``: one row per (kept sample, LSH band): ``sample_id, band_key, params_hash, run_id``.
- ``exact_index``: one row per kept sample: ``content_hash, sample_id, params_hash, run_id``.

Rows are written as run side outputs (committed with the run's idempotent txn after the
samples, quarantine and lineage), only for samples the operator kept. ``params_hash``
covers everything that changes a key (normalization, shingling, permutations, bands), so
a run with other params ignores rows it could not match anyway.

Which rows a run dedups against: every row with its params hash, except the run's own
(a re-run after a crash between commits must not find itself) and, on ``--full``, the
rows of this job's earlier runs (run ids ``{job}-...``: the job's samples are being replaced).

``--full`` and the index (decision: filter, not overwrite): side outputs are appended, so a
``--full`` run writes index rows only for kept samples the index does not list yet under
this params hash. Repeated ``--full`` runs therefore never duplicate index rows; a sample
the full run no longer keeps keeps its old index row (an incremental run may then name it
as ``dup_of``; its lineage still explains where it went).

What "listed" means: a run reads only the index rows that share a key with its new rows (below), so a sample is
listed when the index holds its ``sample_id`` with one of the keys it has now. ``exact_index``: the key is the
content hash, the same rule as when the whole index was read. ``minhash_index`` (and ``image_index``): a sample
whose text, as the dedup step sees it, changed since it was indexed (an upstream cleaning step changed;
``sample_id`` comes from the ingest text) and shares no band key with its old rows is indexed again with its current
bands, beside the old rows; one that shares a band is taken as listed and its new bands are not added. Either way no
row is repeated and no decision is worse.

Reading the index (it grows with the lake: a 100M-sample lake holds billions of band rows): the driver only
lists the table's files (pruned by their ``params_hash``/``run_id`` statistics); the engine's tasks scan them in
batches (``IndexScan``), keeping the rows whose key a new row holds too (``among``: new band keys, new content
hashes). So only the few lake rows that can matter ever exist, on the engine, and never the whole index in one
process (before, ``read_index`` read it whole into the driver on every incremental run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from datahub.lake.files import conform
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.retry import retry_policy, retry_stream, storage_errors
from operators.dedup.steps import BROADCAST_ROWS

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.operator import OperatorContext

MINHASH_INDEX = "minhash_index"
EXACT_INDEX = "exact_index"
MINHASH_INDEX_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("band_key", pa.int64()), ("params_hash", pa.string()), ("run_id", pa.string())]
)
EXACT_INDEX_SCHEMA = pa.schema(
    [("content_hash", pa.string()), ("sample_id", pa.string()), ("params_hash", pa.string()), ("run_id", pa.string())]
)
RUN_ID = "run_id"
T = TypeVar("T")
YIELD_ROWS = 32_768  # a task's matching rows are passed on in tables of about this many (~3 MB of band rows)
MAX_SCAN_TASKS = 64  # the index's files are split among at most this many tasks (each opens the table version once)


_END = b"\x01"  # ends every string key before it is padded: ``a + _END == b + _END`` only when ``a == b``


MAX_KEY_BYTES = 256  # string keys searched as fixed-width bytes up to this width (content hashes: 32 + 1)
MAX_KEY_TABLE_BYTES = 256 * 2**20  # and up to this many padded bytes in all


@dataclass(frozen=True)
class KeySet:
    """The pushed keys, sorted once in the driver, so each batch is a binary search of its rows (``np.searchsorted``,
    O(rows x log keys)). ``pc.is_in(column, value_set=keys)`` per batch built a hash table of all the keys for every
    2,048-row batch: at 1M keys 110-180 ms a batch, 33 s CPU over a 1M-row index. Integers are searched as they
    are; strings as fixed-width bytes (each key plus ``_END``, NUL-padded to the longest); other types by
    ``pc.is_in``. A null never matches (as ``pc.is_in(..., skip_nulls=True)`` and the hash-join path: the old
    ``pc.is_in`` default matched a null row when the keys held a null). String keys wider than ``MAX_KEY_BYTES``
    (or more than ``MAX_KEY_TABLE_BYTES`` padded) are searched by ``pc.is_in``: padding every key to the longest
    would take keys x longest bytes (100k keys and one of 100 KB: 10 GB)."""

    sorted_keys: np.ndarray | None  # integers, or ``S{width}`` byte strings; None: ``keys`` are used as they are
    width: int  # string keys: the longest key in bytes plus ``_END``
    keys: pa.Array | None = None

    @classmethod
    def of(cls, keys: pa.Array) -> KeySet:
        keys = keys.drop_null()
        if pa.types.is_integer(keys.type):
            return cls(np.sort(keys.to_numpy()), 0)
        if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
            raw = pc.cast(keys, pa.large_binary())
            width = (pc.max(pc.binary_length(raw)).as_py() or 0) + len(_END)
            if width <= MAX_KEY_BYTES and width * len(raw) <= MAX_KEY_TABLE_BYTES:
                return cls(np.sort(np.array(_ended(raw).to_numpy(zero_copy_only=False), dtype=f"S{width}")), width)
        return cls(None, 0, keys)

    def __len__(self) -> int:
        return len(self.sorted_keys) if self.sorted_keys is not None else len(self.keys or [])

    def contains(self, column: pa.Array) -> pa.Array:
        """A boolean array: whether each value of ``column`` is one of the keys (false for a null)."""
        if self.sorted_keys is None:
            assert self.keys is not None
            keys = self.keys if self.keys.type == column.type else self.keys.cast(column.type)
            return pc.is_in(column, value_set=keys)
        if not len(column) or not len(self.sorted_keys):
            return pa.array(np.zeros(len(column), dtype=bool))
        if self.width:
            raw = pc.fill_null(pc.cast(column, pa.large_binary()), b"")
            fits = pc.less_equal(pc.binary_length(raw), self.width - len(_END)).to_numpy(zero_copy_only=False)
            # a longer value is no key: truncated to ``width`` it could look like one
            values = np.array(_ended(raw).to_numpy(zero_copy_only=False), dtype=f"S{self.width}")
        else:
            values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
            fits = None
        at = np.minimum(np.searchsorted(self.sorted_keys, values), len(self.sorted_keys) - 1)
        found = self.sorted_keys[at] == values
        if fits is not None:
            found &= fits
        if column.null_count:
            found &= column.is_valid().to_numpy(zero_copy_only=False)
        return pa.array(found)


def _ended(raw: pa.Array) -> pa.Array:
    end = pa.scalar(_END, pa.large_binary())
    return pc.binary_join_element_wise(raw, end, pa.scalar(b"", pa.large_binary()))


@dataclass(frozen=True)
class IndexScan:
    """An engine task's read of some of an index table's files (picklable; ``Engine.read_files``' read function).

    Yields the rows with ``params_hash`` of other runs than ``run_id``, ``columns`` plus ``run_id``; with
    ``key``/``values`` only rows whose ``key`` is one of ``values``. Files are decoded in ``scan_batches``' small
    batches; matching rows are passed on in tables of about ``YIELD_ROWS`` rows. A task that finds no row yields one
    empty table, so every engine knows the frame's schema. A transient storage error is retried as ``Lake.read``
    retries it (``lake.retry``): the scan starts again and skips the batches already read (``retry_stream``)."""

    lake: Lake
    table: str
    version: int
    schema: pa.Schema  # the output: ``columns`` then ``run_id``, typed as the index writes them
    params_hash: str
    run_id: str
    key: str | None = None
    values: KeySet | None = None  # sorted in the driver, once for every task

    def _batches(self, files: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
        with _reading(self.lake, self.table, self.version):
            dataset = self.lake.dataset(self.table, self.version,
                                        file_pruning_predicate=_file_predicate(self.params_hash, self.run_id))
            yield from scan_batches(dataset, columns=self.schema.names, files=files,
                                    values_in=("params_hash", [self.params_hash]))

    def __call__(self, files: tuple[str, ...]) -> Iterator[pa.Table]:
        found, pending, held = False, [], 0
        where = f"scan {self.lake.table_uri(self.table)} version {self.version}"
        for batch in retry_stream(partial(self._batches, files), self.lake.retry, where=where):
            # a null run_id is no run's (IndexRows never writes one): never matched, as file pruning treats it
            mask = pc.fill_null(pc.not_equal(batch.column(RUN_ID), self.run_id), False)
            if self.key is not None and self.values is not None:
                mask = pc.and_(mask, self.values.contains(batch.column(self.key)))
            rows = conform(pa.Table.from_batches([batch]).filter(mask), self.schema)
            if rows.num_rows:
                pending.append(rows)
                held += rows.num_rows
            if held >= YIELD_ROWS:
                found = True
                yield pa.concat_tables(pending).combine_chunks()
                pending, held = [], 0
        if pending or not found:
            yield pa.concat_tables(pending).combine_chunks() if pending else self.schema.empty_table()


@dataclass(frozen=True)
class OtherJobs:
    """Rows of other jobs than ``job`` (its run ids are ``{job}-...``), without ``run_id``."""

    job: str | None
    columns: tuple[str, ...]

    def __call__(self, table: pa.Table) -> pa.Table:
        if self.job is not None and table.num_rows:
            table = table.filter(pc.invert(pc.fill_null(pc.starts_with(table.column(RUN_ID), f"{self.job}-"), False)))
        return table.select(list(self.columns))


def read_index(context: OperatorContext, table: str, *, columns: list[str], params_hash: str,
               among: tuple[str, Frame], schema: pa.Schema | None = None) -> tuple[Frame, Frame] | None:
    """``(match_against, already_indexed)``: frames of the rows of ``table`` with ``params_hash`` whose ``among[0]``
    column holds one of the values of the one-column frame ``among[1]`` (distinct values, e.g. the new rows' band
    keys), ``columns`` only. None when no such row exists (no table, no file, no match).

    ``match_against``: the rows new samples dedup against (see the module docstring).
    ``already_indexed``: every such row but this run's own, so side outputs never repeat a row.

    The driver lists files; engine tasks scan them (``IndexScan``). Up to ``BROADCAST_ROWS`` values go to every
    task, which keeps only matching rows as it reads; more are hash-joined on the engine. Either way only matching
    rows are held (materialized on the engine: both results are read several times)."""
    schema = schema or _schema(table)
    key, values_frame = among
    if not context.lake.exists(table):
        return None
    lake = context.lake

    def listing() -> tuple[int, list[str]]:
        version = lake.table(table).version()
        dataset = lake.dataset(table, version, file_pruning_predicate=_file_predicate(params_hash, context.run_id))
        return version, [fragment.path for fragment in dataset.get_fragments()]

    version, files = _retried(lake, table, None, listing)
    if not files:
        return None
    wanted = pa.schema([schema.field(c) for c in dict.fromkeys([*columns, RUN_ID])])
    values_frame = values_frame.materialize()  # counted, then read or joined
    pushed = values_frame.count() <= BROADCAST_ROWS
    values = None
    if pushed:
        values = KeySet.of(pc.unique(values_frame.to_arrow().column(0).cast(wanted.field(key).type).combine_chunks()))
        if not len(values):
            return None
    scan = IndexScan(lake, table, version, wanted, params_hash, context.run_id, key if pushed else None, values)
    tasks = min(len(files), MAX_SCAN_TASKS)
    groups = [tuple(files[i::tasks]) for i in range(tasks)]
    rows = context.read_files(groups, scan)
    if not pushed:
        rows = rows.join(values_frame, on=[key], how="inner")
    rows = rows.materialize()
    if rows.count() == 0:
        return None
    match = rows.map_batches(OtherJobs(context.job_name if context.full else None, tuple(columns)),
                             name=f"{table}.match")
    known = rows.map_batches(OtherJobs(None, tuple(columns)), name=f"{table}.known")
    return match, known


def lake_rows_of(lake: Lake, table: str, columns: list[str], sample_ids: pa.Array) -> pa.Table:
    """The rows of ``table`` whose ``sample_id`` is one of ``sample_ids`` (a few: e.g. the lake samples a
    verify step compares), ``columns`` only, in bounded batches (``datahub.lake.scan``). The ``sample_id`` column
    finds the files that hold one (row groups whose statistics exclude every id are skipped); only those files'
    other columns (the texts) are decoded: memory holds a batch and the matches, never a column of the table."""
    empty = pa.schema([(c, pa.string()) for c in columns]).empty_table()
    if not len(sample_ids) or not lake.exists(table):
        return empty
    version = _retried(lake, table, None, lambda: lake.table(table).version())  # the log read retried too
    ids = ("sample_id", sample_ids.to_pylist())

    def attempt() -> pa.Table:  # the matches only (a few rows): read again whole on a transient error
        import pyarrow.dataset as ds

        dataset = lake.dataset(table, version)
        # one walk of the table's files; each file is scanned as a dataset of its own (``scan_batches(files=...)``
        # walks every fragment of the table per call: files x files over the table)
        files = [ds.FileSystemDataset([fragment], dataset.schema, dataset.format, filesystem=dataset.filesystem)
                 for fragment in dataset.get_fragments()]
        holding = [one for one in files if any(b.num_rows for b in scan_batches(one, columns=["sample_id"], values_in=ids))]
        batches = [b for one in holding for b in scan_batches(one, columns=columns, values_in=ids) if b.num_rows]
        return pa.Table.from_batches(batches).select(columns) if batches else empty

    return _retried(lake, table, version, attempt)


@contextmanager
def _reading(lake: Lake, table: str, version: int | None) -> Iterator[None]:
    """Transient storage errors as ``StorageError`` (retried by the caller), a vanished data file as the
    ``LakeError`` ``Lake.read`` gives."""
    at = f" version {version}" if version is not None else ""
    with storage_errors(f"read {lake.table_uri(table)}{at}"):
        try:
            yield
        except FileNotFoundError as exc:
            raise LakeError(f"{lake.table_uri(table)}{at}: a data file was not found ({exc}); it was deleted "
                            "(`datahub release vacuum`, or by hand) or the storage lost it") from None


def _retried(lake: Lake, table: str, version: int | None, fn: Callable[[], T]) -> T:
    """``fn()``, retried on transient storage errors as ``Lake.read`` is (``lake.retry``)."""

    def attempt() -> T:
        with _reading(lake, table, version):
            return fn()

    return retry_policy(attempt, lake.retry)


def _file_predicate(params_hash: str, run_id: str) -> list[tuple[str, str, str]]:
    """Files whose statistics may hold rows with ``params_hash`` of another run than ``run_id`` (the index is
    not partitioned; each run writes its own files, so the statistics rule out other params and this run)."""
    return [("params_hash", "=", params_hash), (RUN_ID, "!=", run_id)]


def _schema(table: str) -> pa.Schema:
    return MINHASH_INDEX_SCHEMA if table == MINHASH_INDEX else EXACT_INDEX_SCHEMA

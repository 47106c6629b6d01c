"""The rows of a table version that take-downs name, in bounded memory and time linear in ids + rows: by sample id
(many, sorted) or by source file.

The given ids are sorted in runs spilled to local disk and merged into one file (``SortedIds``), each with the code
of what named it; they are cut into partitions of at most ``PARTITION_IDS`` ids, the lookup set held at a time. The
version's ``sample_id`` (and the code of its ``source_uri``) is read once and split by the partitions' id ranges
(``RangeSplit``: with one partition it is not spilled, with more each row goes, with its number, to the partition
whose range holds it, rows without an id to the last), so each partition's ids are looked up in its own rows only:
one read of the version and one of the spill, whatever the number of partitions (a sort-merge join without sorting
the version). A row whose id is in no partition is judged by its ``source_uri`` in its partition's pass, so every
row is taken once. The rows taken are numbered in scan order; their numbers, spilled and read back in order, drive
the pass that writes the rows that stay. Shared by ``release redact`` and by ``release create`` after redactions
(``exclude``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.scan import scan_batches
from datahub.lake.scratch import HeldScratch
from datahub.release.freeze import regrouped
from datahub.release.merge_dedup import ROW, RowCursor

BATCH_ROWS = 8192  # of ids and source_uri
# whole rows: batches read and Parquet row groups written (delta-rs buffers a row group; 32k rows of 5 KB texts
# would be 160 MB)
ROW_BATCH_ROWS = 2048
# sample ids held at a time as a lookup set (the rest wait in sorted runs on local disk), looked up by pc.index_in in
# calls of as many scanned ids. index_in builds a hash table of the set at every call: ~72 B per 32-hex id, but 200 B
# at exactly a power of two (524,288 ids: 100 MB; 524,287: 36 MB). Measured at 250,000 ids (releases_containing on
# the 4M-row lake of benchmarks/release_scale.py): 38 MB of Arrow memory in all; more ids take more partitions,
# each looked up in its own share of the version's rows (``RangeSplit``)
PARTITION_IDS = (1 << 18) - 1
# scanned rows split among the partitions at a time: each partition gets one spilled batch of its share (~60 B a
# row held: 4 MB, whatever the number of partitions)
SPLIT_ROWS = 1 << 16
TAKEN_ROWS = pa.schema([(ROW, pa.int64())])
CODE = "code"
IDS_PREFIX = "datahub-ids-"  # spill folders (datahub.lake.scratch: a killed process's are swept by the next one)
LOOKUP_PREFIX = "datahub-lookup-"
_IDS = pa.schema([("sample_id", pa.string())])
_CODED_IDS = pa.schema([("sample_id", pa.string()), (CODE, pa.int32())])


class SortedIds:
    """Distinct sample ids in sorted order, gathered in any order and spilled to local disk (sorted runs of at most
    ``run_rows`` ids, merged once into one file), then read back as often as needed, a block at a time: a
    take-down of millions of rows holds one block, not its ids. With ``codes``, each id carries an int32 code (the
    smallest one given for it is kept: e.g. the first redaction that took it down)."""

    def __init__(self, *, run_rows: int | None = None, codes: bool = False) -> None:
        self._schema = _CODED_IDS if codes else _IDS
        self._runs: SortedRuns | None = SortedRuns(self._schema, "sample_id", order=CODE if codes else None,
                                                   run_rows=run_rows,
                                                   read_rows=min(BATCH_ROWS, run_rows or BATCH_ROWS))
        self._scratch: HeldScratch | None = None
        self._bounds: dict[int, list[pa.Scalar]] = {}  # bounds(ids) once read: the file does not change once sealed
        self.count = 0  # distinct ids, known once sealed

    def __enter__(self) -> SortedIds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def coded(self) -> bool:
        return CODE in self._schema.names

    def add(self, ids: pa.Array | pa.ChunkedArray, codes: pa.Array | pa.ChunkedArray | None = None) -> None:
        """Ids (nulls left out), with their codes when made ``codes=True``."""
        assert self._runs is not None, "add before seal()"
        assert (codes is not None) == self.coded, "codes with every id, and only then"
        columns = [ids] if codes is None else [ids, codes]
        table = pa.table(columns, names=self._schema.names)
        if table.column(0).null_count:
            table = table.filter(pc.is_valid(table.column(0)))
        if table.num_rows:
            self._runs.add(table.cast(self._schema))

    def seal(self) -> SortedIds:
        """Merge what was added into one sorted file (done once, before reading)."""
        assert self._runs is not None, "sealed twice"
        self._scratch = HeldScratch(IDS_PREFIX)
        with self._runs, pa.OSFile(self._path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for block in self._runs.merged():
                writer.write_table(block)
                self.count += block.num_rows
        self._runs = None
        return self

    @property
    def _path(self) -> str:
        assert self._scratch is not None
        return os.path.join(self._scratch.path, "ids.arrow")

    def _tables(self) -> Iterator[pa.RecordBatch]:
        with pa.OSFile(self._path, "rb") as source:
            reader = pa.ipc.open_file(source)
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)

    def blocks(self) -> Iterator[pa.Array]:
        """The ids in order, a spilled block at a time."""
        for batch in self._tables():
            yield batch.column(0)

    def chunks(self, ids: int) -> Iterator[pa.Array]:
        """The ids in order, in arrays of ``ids`` (the last one shorter)."""
        for chunk in self.coded_chunks(ids):
            yield chunk.column(0)

    def coded_chunks(self, ids: int) -> Iterator[pa.RecordBatch]:
        """The ids (and codes) in order, in batches of ``ids`` (the last one shorter)."""
        blocks = (pa.Table.from_batches([block], self._schema) for block in self._tables())
        for chunk in regrouped(blocks, ids):
            yield from chunk.to_batches()  # one batch: regrouped combines each chunk

    def bounds(self, ids: int) -> list[pa.Scalar]:
        """The first id of each of ``chunks(ids)`` but the first: where each partition's share of the id range
        begins (one read of the file, nothing held but these; kept, so the lookups of several releases, as
        ``releases_containing`` makes, read them once)."""
        if ids not in self._bounds:
            self._bounds[ids] = self._read_bounds(ids)
        return list(self._bounds[ids])

    def _read_bounds(self, ids: int) -> list[pa.Scalar]:
        found: list[pa.Scalar] = []
        offset = 0
        for block in self.blocks():
            position = len(found) + 1  # the index of the next partition whose first id is wanted
            while position * ids < offset + len(block):
                found.append(block[position * ids - offset])
                position += 1
            offset += len(block)
        return found

    def close(self) -> None:
        if self._runs is not None:
            self._runs.close()
            self._runs = None
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None


@dataclass(frozen=True)
class Scanned:
    """Rows of one lookup call: their sample ids (null where a row has none), their numbers in scan order, and the
    code of each row's source (null: not a named source; None: no sources asked for)."""

    ids: pa.ChunkedArray
    rows: np.ndarray
    by_source: pa.ChunkedArray | None


@dataclass(frozen=True)
class Taken:
    """Rows of one lookup call that a take-down names: their sample ids (null where a row has none), their numbers in
    scan order, and the code that took each (the id's, else its source's)."""

    ids: pa.Array
    rows: np.ndarray
    codes: pa.Array


def partition_of(ids: pa.Array | pa.ChunkedArray, bounds: pa.Array) -> np.ndarray:
    """For each id, the partition whose range holds it: how many of the sorted ``bounds`` are <= it (a vectorized
    binary search, log2(len(bounds)) compares of the whole array); a null id goes to the last partition."""
    lowest = np.zeros(len(ids), dtype=np.int64)
    highest = np.full(len(ids), len(bounds), dtype=np.int64)
    if not len(bounds) or not len(ids):
        return lowest
    while True:
        open_ = lowest < highest
        if not open_.any():
            return lowest
        middle = np.minimum((lowest + highest) // 2, len(bounds) - 1)
        above = pc.fill_null(pc.greater_equal(ids, bounds.take(pa.array(middle))), True)
        above = np.asarray(above.to_numpy(zero_copy_only=False), dtype=bool)
        lowest = np.where(open_ & above, middle + 1, lowest)
        highest = np.where(open_ & ~above, middle, highest)


class RangeSplit:
    """The ``sample_id`` of a table version (with each row's number and, given ``sources``, its source's code) split
    by the id ranges of partitions (``bounds``: the first id of each but the first): read once, and with more than
    one partition spilled to one local Arrow file, a batch of each partition's share per ``SPLIT_ROWS`` rows read,
    whose batch numbers are kept per partition. ``rows(partition)`` gives a partition's rows back in scan order.
    Local disk: the version's ids, row numbers and source codes once (~50 B a row of 32-hex ids), only when the
    given ids fill more than one partition."""

    def __init__(self, dataset: Any, bounds: Sequence[pa.Scalar], *, sources: dict[str, int] | None = None) -> None:
        self._dataset = dataset
        by_source = sources if sources and "source_uri" in dataset.schema.names else {}
        self._uris = pa.array(sorted(by_source), pa.string())
        self._uri_codes = pa.array([by_source[u] for u in self._uris.to_pylist()], pa.int32())
        self._columns = ["sample_id", "source_uri"] if len(self._uris) else ["sample_id"]
        id_type = pa.schema(dataset.schema).field("sample_id").type
        self._bounds = pa.array([b.as_py() for b in bounds], id_type)
        self._schema = pa.schema([("sample_id", id_type), (ROW, pa.int64())]
                                 + ([("by_source", pa.int32())] if len(self._uris) else []))
        self._scratch: HeldScratch | None = None
        self._batches: list[list[int]] = []  # each partition's batch numbers in the spill

    @property
    def partitions(self) -> int:
        return len(self._bounds) + 1

    def __enter__(self) -> RangeSplit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None

    def _scanned(self, rows: int) -> Iterator[pa.RecordBatch]:
        """The version's rows (id, number, source code), at least ``rows`` at a time (the last may be shorter)."""
        first = 0
        held: list[pa.RecordBatch] = []
        count = 0
        for batch in scan_batches(self._dataset, columns=self._columns, batch_rows=BATCH_ROWS):
            columns = [batch.column("sample_id"), pa.array(np.arange(first, first + batch.num_rows), pa.int64())]
            if len(self._uris):
                columns.append(pc.take(self._uri_codes, pc.index_in(batch.column("source_uri"),
                                                                    value_set=self._uris)))
            first += batch.num_rows
            held.append(pa.RecordBatch.from_arrays(columns, schema=self._schema))
            count += batch.num_rows
            if count >= rows:
                yield pa.Table.from_batches(held, self._schema).combine_chunks().to_batches()[0]
                held, count = [], 0
        if held:
            yield pa.Table.from_batches(held, self._schema).combine_chunks().to_batches()[0]

    def _spill(self) -> str:
        """Split the version's rows by partition into one Arrow file (done once)."""
        self._scratch = HeldScratch(LOOKUP_PREFIX)
        path = os.path.join(self._scratch.path, "rows.arrow")
        self._batches = [[] for _ in range(self.partitions)]
        written = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self._schema) as writer:
            for block in self._scanned(SPLIT_ROWS):
                partition = partition_of(block.column("sample_id"), self._bounds)
                order = np.argsort(partition, kind="stable")  # scan order within a partition
                ends = np.cumsum(np.bincount(partition, minlength=self.partitions))
                grouped = block.take(pa.array(order))
                start = 0
                for index, end in enumerate(ends.tolist()):
                    if end > start:
                        writer.write_batch(grouped.slice(start, end - start))
                        self._batches[index].append(written)
                        written += 1
                    start = end
        return path

    def rows(self, partition: int, *, lookup_rows: int) -> Iterator[Scanned]:
        """The rows of ``partition``'s id range (all rows when there is one partition), in scan order, in lookup
        calls of at least ``lookup_rows`` rows (the last may be shorter) as chunked arrays of the batches read."""
        if self.partitions == 1:
            yield from self._lookups(self._scanned(BATCH_ROWS), lookup_rows)
            return
        path = self._spill() if self._scratch is None else os.path.join(self._scratch.path, "rows.arrow")
        with pa.OSFile(path, "rb") as source:
            reader = pa.ipc.open_file(source)
            yield from self._lookups((reader.get_batch(i) for i in self._batches[partition]), lookup_rows)

    def _lookups(self, batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[Scanned]:
        held: list[pa.RecordBatch] = []
        count = 0
        for batch in batches:
            held.append(batch)
            count += batch.num_rows
            if count >= rows:
                yield self._lookup(held)
                held, count = [], 0
        if held:
            yield self._lookup(held)

    def _lookup(self, batches: list[pa.RecordBatch]) -> Scanned:
        table = pa.Table.from_batches(batches, self._schema)
        rows = np.concatenate([b.column(ROW).to_numpy() for b in batches]) if batches else np.zeros(0, np.int64)
        return Scanned(table.column("sample_id"), rows,
                       table.column("by_source") if len(self._uris) else None)


def taken_rows(dataset: Any, ids: SortedIds | None, *, partition_ids: int = PARTITION_IDS,
               sources: dict[str, int] | None = None) -> Iterator[Taken]:
    """The rows of ``dataset`` whose id is among ``ids`` (sealed; their codes when coded, else 0) or whose
    ``source_uri`` is one of ``sources`` (uri -> code), each once: one read of the version, split by the id ranges
    of the partitions of ``partition_ids`` ids (``RangeSplit``), then each partition looked up in its own rows."""
    given = ids if ids is not None and ids.count else None
    bounds = given.bounds(partition_ids) if given is not None else []
    chunks: Iterator[pa.RecordBatch | None] = given.coded_chunks(partition_ids) if given is not None else iter([None])
    with RangeSplit(dataset, bounds, sources=sources) as split:
        for index, chunk in enumerate(chunks):
            values = chunk.column(0) if chunk is not None else None
            codes = (chunk.column(CODE) if chunk is not None and CODE in chunk.schema.names
                     else pa.array(np.zeros(len(values) if values is not None else 0, dtype=np.int32)))
            # pc.index_in builds its hash table of the value set at every call (8,192 ids against 250,000: 3.1 s per
            # million rows; 262,144: 0.09 s), once for all chunks of a chunked array: each call gets at least as
            # many ids as the partition holds, as the batches read (not joined into one copy)
            lookup_rows = max(BATCH_ROWS, len(values) if values is not None else 0)
            for scanned in split.rows(index, lookup_rows=lookup_rows):
                by = (pc.take(codes, pc.index_in(scanned.ids, value_set=values)) if values is not None
                      else pa.chunked_array([pa.nulls(len(scanned.ids), pa.int32())]))
                if scanned.by_source is not None:
                    by = pc.coalesce(by, scanned.by_source)
                hit = pc.is_valid(by)
                if pc.any(hit).as_py():
                    mask = np.asarray(hit.to_numpy(), dtype=bool)
                    yield Taken(scanned.ids.filter(hit).combine_chunks(), scanned.rows[mask],
                                by.filter(hit).combine_chunks())


def taken_row_runs() -> SortedRuns:
    """Where the taken rows' numbers are spilled (``add_taken``), to be read back in order by ``rows_kept``."""
    return SortedRuns(TAKEN_ROWS, ROW)


def add_taken(runs: SortedRuns, taken: Taken) -> None:
    runs.add(pa.table([pa.array(taken.rows, pa.int64())], schema=TAKEN_ROWS))


def rows_kept(dataset: Any, taken: SortedRuns, *, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
    """Every column (or ``columns``) of the rows that stay, in the version's order, ``ROW_BATCH_ROWS`` rows read at a
    time (the taken rows' numbers read back in order: ``taken`` is read once)."""
    gone = RowCursor(taken.merged(), TAKEN_ROWS)
    first = 0
    for batch in scan_batches(dataset, columns=columns, batch_rows=ROW_BATCH_ROWS):
        rows = gone.take(first, first + batch.num_rows).column(ROW).to_numpy() - first
        first += batch.num_rows
        keep = np.ones(batch.num_rows, dtype=bool)
        keep[rows] = False
        yield pa.Table.from_batches([batch]).filter(pa.array(keep))

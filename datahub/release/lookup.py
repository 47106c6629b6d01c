"""The rows of a table version that take-downs name, in bounded memory: by sample id (many, sorted) or by source file.

The ids come sorted, a partition of at most ``PARTITION_IDS`` at a time (each id with the code of what named it), and
the version's ``sample_id`` (and ``source_uri``) is scanned once per partition; a row whose id is in no partition is
judged by its ``source_uri`` in one pass only, the one whose share of the sorted id range holds it (rows without an
id: the last pass), so every row is taken once. The rows taken are numbered in scan order; their numbers, spilled and
read back in order, drive the pass that writes the rows that stay. Shared by ``release redact`` and by ``release
create`` after redactions (``exclude``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.scan import scan_batches
from datahub.release.merge_dedup import ROW, RowCursor

BATCH_ROWS = 8192  # of ids and source_uri
# whole rows: batches read and Parquet row groups written (delta-rs buffers a row group; 32k rows of 5 KB texts
# would be 160 MB)
ROW_BATCH_ROWS = 2048
# sample ids held at a time as a lookup set (the rest wait in sorted runs on local disk), looked up by pc.index_in in
# calls of as many scanned ids. index_in builds a hash table of the set at every call: ~72 B per 32-hex id, but 200 B
# at exactly a power of two (524,288 ids: 100 MB; 524,287: 36 MB). Measured at 250,000 ids (releases_containing on
# the 4M-row lake of benchmarks/release_scale.py): 38 MB of Arrow memory in all; more ids take more passes instead
PARTITION_IDS = (1 << 18) - 1
TAKEN_ROWS = pa.schema([(ROW, pa.int64())])


@dataclass(frozen=True)
class Partition:
    """Sorted distinct ids looked up in one pass, the code of each (None: 0 for all), and the first id of the next
    partition (None: this is the last), where this pass's share of the id range ends."""

    ids: pa.Array
    codes: pa.Array | None
    high: pa.Scalar | None


@dataclass(frozen=True)
class Taken:
    """Rows of one lookup call that a take-down names: their sample ids (null where a row has none), their numbers in
    scan order, and the code that took each (the id's, else its source's)."""

    ids: pa.Array
    rows: np.ndarray
    codes: pa.Array


def taken_rows(dataset: Any, partitions: Iterable[Partition], *, sources: dict[str, int] | None = None
               ) -> Iterator[Taken]:
    """The rows of ``dataset`` whose id is in one of ``partitions`` (sorted, in order) or whose ``source_uri`` is
    one of ``sources`` (uri -> code), each once. One scan per partition (one when there are none: sources only)."""
    by_source = sources if sources and "source_uri" in dataset.schema.names else {}
    uris = pa.array(sorted(by_source), pa.string())
    uri_codes = pa.array([by_source[u] for u in uris.to_pylist()], pa.int32())
    columns = ["sample_id", "source_uri"] if len(uris) else ["sample_id"]
    low: pa.Scalar | None = None
    for partition in _or_one(partitions):
        ids = partition.ids if partition is not None else None
        codes = (partition.codes if partition is not None and partition.codes is not None
                 else pa.array(np.zeros(len(ids) if ids is not None else 0, dtype=np.int32)))
        high = partition.high if partition is not None else None
        # pc.index_in builds its hash table of the value set at every call (8,192 ids against 250,000: 3.1 s per
        # million rows; 262,144: 0.09 s), once for all chunks of a chunked array: each call gets at least as many
        # ids as the partition holds, as the scan's own batches (not joined into one copy), and the ids alone (a
        # batch's source_uri is folded into its sources' codes at once)
        lookup_rows = max(BATCH_ROWS, len(ids) if ids is not None else 0)
        first = 0
        scan = scan_batches(dataset, columns=columns, batch_rows=BATCH_ROWS)
        for column, by_uri in lookup_batches(scan, uris, uri_codes, lookup_rows):
            by = (pc.take(codes, pc.index_in(column, value_set=ids)) if ids is not None
                  else pa.chunked_array([pa.nulls(len(column), pa.int32())]))
            if by_uri is not None:
                mine = pa.chunked_array([pa.repeat(pa.scalar(True), len(column))])
                if low is not None:
                    mine = pc.and_(mine, pc.greater_equal(column, low))
                if high is not None:
                    mine = pc.and_(mine, pc.less(column, high))
                mine = pc.fill_null(mine, high is None)  # a row without an id: the last pass
                by = pc.coalesce(by, pc.if_else(mine, by_uri, pa.scalar(None, pa.int32())))
            hit = pc.is_valid(by)
            if pc.any(hit).as_py():
                rows = np.flatnonzero(hit.to_numpy()) + first
                yield Taken(column.filter(hit).combine_chunks(), rows, by.filter(hit).combine_chunks())
            first += len(column)
        low = high


def _or_one(partitions: Iterable[Partition]) -> Iterator[Partition | None]:
    """The partitions, or one None (a pass by source alone) when there are none."""
    empty = True
    for partition in partitions:
        empty = False
        yield partition
    if empty:
        yield None


def lookup_batches(batches: Iterator[pa.RecordBatch], uris: pa.Array, uri_codes: pa.Array, rows: int
                    ) -> Iterator[tuple[pa.ChunkedArray, pa.ChunkedArray | None]]:
    """(sample_id, the code of the row's source or null) of the scanned ``batches``, handed out at least ``rows``
    at a time (the last may be shorter) as chunked arrays of those batches; no codes without ``uris``."""
    ids: list[pa.Array] = []
    codes: list[pa.Array] = []
    count = 0
    for batch in batches:
        ids.append(batch.column("sample_id"))
        if len(uris):
            codes.append(pc.take(uri_codes, pc.index_in(batch.column("source_uri"), value_set=uris)))
        count += batch.num_rows
        if count >= rows:
            yield _lookup_batch(ids, codes, uris)
            ids, codes, count = [], [], 0
    if ids:
        yield _lookup_batch(ids, codes, uris)


def _lookup_batch(ids: list[pa.Array], codes: list[pa.Array], uris: pa.Array
                  ) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    return (pa.chunked_array(ids, pa.string()), pa.chunked_array(codes, pa.int32()) if len(uris) else None)


def taken_row_runs() -> SortedRuns:
    """Where the taken rows' numbers are spilled (``add_taken``), to be read back in order by ``rows_kept``."""
    return SortedRuns(TAKEN_ROWS, ROW)


def add_taken(runs: SortedRuns, taken: Taken) -> None:
    runs.add(pa.table([pa.array(taken.rows, pa.int64())], schema=TAKEN_ROWS))


def rows_kept(dataset: Any, taken: SortedRuns) -> Iterator[pa.Table]:
    """Every column of the rows that stay, in the version's order, ``ROW_BATCH_ROWS`` rows read at a time (the taken
    rows' numbers read back in order)."""
    gone = RowCursor(taken.merged(), TAKEN_ROWS)
    first = 0
    for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
        rows = gone.take(first, first + batch.num_rows).column(ROW).to_numpy() - first
        first += batch.num_rows
        keep = np.ones(batch.num_rows, dtype=bool)
        keep[rows] = False
        yield pa.Table.from_batches([batch]).filter(pa.array(keep))

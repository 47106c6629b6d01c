"""Sorting more rows than memory should hold: sorted runs spilled to local Arrow IPC files, merged in bounded memory.

``SortedRuns`` takes batches of rows with a ``key`` column (no nulls), sorts every ``run_rows`` of them, keeps the
first row added of each key (stable sort: e.g. a release's first source of a sample id), or with ``counts`` sums
that column over the rows of a key (e.g. how often a value occurs), and writes each sorted run to a temporary file; ``merged()`` then streams the distinct rows in key order, reading each run ``read_rows`` at a
time. With ``order`` (a second column, no nulls) rows sort by (key, order) and the row kept for a key is the one
with the smallest ``order``, whatever the adding order; with ``distinct=False`` every row is kept (sorted by
(key, order), e.g. to walk the groups of equal keys). A stream that fits in one run is never written to disk. Memory: one run while adding; ``FAN_IN`` x ``read_rows`` rows while merging
(more runs than that are first merged in groups into longer runs); disk: the rows once (twice past ``FAN_IN`` runs).

The merge is vectorized: each step takes, from every run's current block, the rows up to the smallest of the
blocks' last keys (keys are distinct within a run, so every row of every run with that key or below is then in
hand), sorts just those, keeps the first of equal keys (runs are in adding order) or sums their counts, and emits
them. Runs of every row (``distinct=False``) bound each step by the smallest last (key, order) instead, so rows of
one key spread over several blocks still come out in (key, order) order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.scratch import HeldScratch

RUN_ROWS = 65_536
READ_ROWS = 8_192
FAN_IN = 32  # runs merged at once: FAN_IN x READ_ROWS rows are held while merging
SORT_PREFIX = "datahub-sort-"  # its spill folders (datahub.lake.scratch: a killed process's are swept)


class SortedRuns:
    """Rows added in batches, given back sorted by ``key``, one per key (see the module docstring); a context manager
    that removes its spill directory on exit."""

    def __init__(self, schema: pa.Schema, key: str, *, counts: str | None = None, order: str | None = None,
                 distinct: bool = True, run_rows: int | None = None, read_rows: int | None = None,
                 directory: str | None = None) -> None:
        for name in (key, counts, order):
            if name is not None and name not in schema.names:
                raise KeyError(f"column {name!r} is not among the columns ({', '.join(schema.names)})")
        if counts is not None and not distinct:
            raise ValueError("counts= sums the rows of a key: it needs distinct=True")
        self.schema = schema
        self.key = key
        self.counts = counts
        self.order = order
        self.distinct = distinct
        self._sort_keys = [(key, "ascending")] + ([(order, "ascending")] if order is not None else [])
        self.run_rows = run_rows or RUN_ROWS
        self.read_rows = read_rows or READ_ROWS
        self._parent = directory
        self._scratch: HeldScratch | None = None
        self._buffer: list[pa.Table] = []
        self._buffered = 0
        self._runs: list[str] = []
        self._written = 0

    def __enter__(self) -> SortedRuns:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Remove the spill files."""
        if self._scratch is not None:
            self._scratch.close()
            self._scratch = None
        self._runs = []
        self._buffer, self._buffered = [], 0

    @property
    def spilled_runs(self) -> int:
        return len(self._runs)

    def add(self, rows: pa.Table | pa.RecordBatch) -> None:
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        if not table.num_rows:
            return
        for name in (self.key, self.order):
            if name is not None and table.column(name).null_count:
                raise ValueError(f"sort column {name!r} has nulls; drop them before adding")
        self._buffer.append(table.select(self.schema.names).cast(self.schema))
        self._buffered += table.num_rows
        if self._buffered >= self.run_rows:
            self._spill(self._sorted_buffer())

    def merged(self) -> Iterator[pa.Table]:
        """The first row added of each key (``counts``: with the key's summed counts; ``order``: the row of the
        smallest order; ``distinct=False``: every row), in key order, in blocks of at most about ``FAN_IN`` x
        ``read_rows`` rows. Read once."""
        if not self._runs:
            table = self._sorted_buffer()
            for start in range(0, table.num_rows, self.read_rows):
                yield table.slice(start, self.read_rows)
            return
        if self._buffered:
            self._spill(self._sorted_buffer())
        while len(self._runs) > FAN_IN:  # longer runs first, so the final merge holds FAN_IN blocks at most
            groups = [self._runs[i:i + FAN_IN] for i in range(0, len(self._runs), FAN_IN)]
            self._runs = []
            for group in groups:
                self._spill_stream(self._merge(group))
                for path in group:
                    os.unlink(path)
        yield from self._merge(self._runs)

    def _sorted_buffer(self) -> pa.Table:
        table = pa.concat_tables(self._buffer) if self._buffer else self.schema.empty_table()
        self._buffer, self._buffered = [], 0
        return self._first_of_each(self._sort(table))

    def _sort(self, table: pa.Table) -> pa.Table:
        if self.order is None:
            return table.take(pc.sort_indices(table.column(self.key)))  # stable sort: adding order within a key
        return table.take(pc.sort_indices(table, sort_keys=self._sort_keys))

    def _first_of_each(self, table: pa.Table) -> pa.Table:
        """``table`` (stably sorted) with one row per key: the first, or with ``counts`` their sum in that column
        (every row with ``distinct=False``)."""
        if table.num_rows < 2 or not self.distinct:
            return table
        keys = table.column(self.key)
        later = pc.equal(keys.slice(1), keys.slice(0, len(keys) - 1))
        keep = pa.chunked_array([pa.array([True]), *pc.invert(later).chunks], pa.bool_())
        first = table.filter(keep)
        if self.counts is None:
            return first
        starts = np.flatnonzero(keep.to_numpy(zero_copy_only=False))
        summed = np.add.reduceat(table.column(self.counts).to_numpy(), starts)
        index = first.schema.get_field_index(self.counts)
        return first.set_column(index, first.schema.field(index), pa.array(summed, first.schema.field(index).type))

    def _path(self) -> str:
        if self._scratch is None:  # removed even when never closed; a killed process's, by the next sort's
            self._scratch = HeldScratch(SORT_PREFIX, parent=self._parent)
        self._written += 1
        return os.path.join(self._scratch.path, f"run-{self._written:06d}.arrow")

    def _spill(self, table: pa.Table) -> None:
        self._spill_stream(table.slice(start, self.read_rows) for start in range(0, table.num_rows, self.read_rows))

    def _spill_stream(self, blocks: Iterable[pa.Table]) -> None:
        path = self._path()
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
            for block in blocks:
                for start in range(0, block.num_rows, self.read_rows):  # the run's blocks stay read_rows long
                    writer.write_table(block.slice(start, self.read_rows), max_chunksize=self.read_rows)
        self._runs.append(path)

    def _merge(self, paths: list[str]) -> Iterator[pa.Table]:
        """The rows of sorted runs ``paths`` in key order, the first run's row of a key repeated across runs (runs
        are in adding order)."""
        # distinct keys: a run's rows of a key are in one block, so the key alone bounds a step; every row: a key's
        # rows may continue in a run's next block, so the bound is the smallest last (key, order)
        columns = [self.key] + ([self.order] if self.order is not None and not self.distinct else [])
        runs = [_Run(path, columns) for path in paths]
        try:
            while True:
                live = [run for run in runs if run.load()]
                if not live:
                    return
                lasts = [run.last() for run in live]
                values = [tuple(v.as_py() for v in last) for last in lasts]
                bound = lasts[values.index(min(values))]
                pieces = [piece for run in live if (piece := run.take_through(bound)).num_rows]
                block = pa.concat_tables(pieces)
                yield self._first_of_each(self._sort(block))
        finally:
            for run in runs:
                run.close()


class _Run:
    """One spilled run read block by block (plain reads, not a memory map: pages read are given back)."""

    def __init__(self, path: str, columns: list[str]) -> None:
        self._columns = columns
        self._file = pa.OSFile(path, "rb")
        self._reader = pa.ipc.open_file(self._file)
        self._next = 0
        self._block: pa.Table | None = None

    def load(self) -> bool:
        """A current block with rows left, reading the next one when needed; False when the run is done."""
        while self._block is None or not self._block.num_rows:
            if self._next >= self._reader.num_record_batches:
                return False
            self._block = pa.Table.from_batches([self._reader.get_batch(self._next)])
            self._next += 1
        return True

    def last(self) -> list[pa.Scalar]:
        """The sort columns' values of the current block's last row."""
        assert self._block is not None
        return [self._block.column(name)[-1] for name in self._columns]

    def take_through(self, bound: list[pa.Scalar]) -> pa.Table:
        """The rows of the current block up to ``bound`` (by key, then order; a prefix: the block is sorted)."""
        assert self._block is not None
        if len(bound) == 1:
            within = pc.less_equal(self._block.column(self._columns[0]), bound[0])
        else:
            key, order = self._block.column(self._columns[0]), self._block.column(self._columns[1])
            within = pc.or_(pc.less(key, bound[0]), pc.and_(pc.equal(key, bound[0]), pc.less_equal(order, bound[1])))
        count = int(pc.sum(within).as_py() or 0)
        piece, self._block = self._block.slice(0, count), self._block.slice(count)
        return piece

    def close(self) -> None:
        self._file.close()

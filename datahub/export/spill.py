"""Spill files on local disk for exports in one process (an engine groups rows in a shuffle instead).

``RankSpill`` (shard export): encoded rows bucketed by export rank, read back shard by shard in order, so the
table's large columns are read once. ``ShardSpill`` (also token export): routed rows grouped by shard. Rows are buffered up to ``budget``
bytes, then every buffered shard gets one Arrow IPC stream appended to its file (``{dir}/{shard}.arrow``, a file
of concatenated streams, opened only while appending). Memory: the budget plus one shard read back; disk: the
encoded release, once.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DEFAULT_BUDGET = 64 * 2**20


class ShardSpill:
    def __init__(self, directory: str, schema: pa.Schema, *, budget: int = DEFAULT_BUDGET) -> None:
        self.directory = directory
        self.schema = schema
        self.budget = budget
        self._buffers: dict[int, list[pa.Table]] = defaultdict(list)
        self._buffered = 0

    def _path(self, shard: int) -> str:
        return os.path.join(self.directory, f"{shard:06d}.arrow")

    def add(self, rows: pa.Table) -> None:
        """Buffer routed rows (a ``shard`` column) by shard; spill when the buffers pass the budget."""
        if not rows.num_rows:
            return
        shards = np.asarray(rows["shard"].combine_chunks())
        order = np.argsort(shards, kind="stable")
        grouped = rows.take(pa.array(order))
        ordered = shards[order]
        cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
        for begin, end in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(ordered)]]).tolist()):
            self._buffers[int(ordered[begin])].append(grouped.slice(begin, end - begin))
        self._buffered += grouped.nbytes
        if self._buffered >= self.budget:
            self.flush()

    def flush(self) -> None:
        for shard, parts in self._buffers.items():
            with open(self._path(shard), "ab") as handle, pa.ipc.new_stream(handle, self.schema) as stream:
                for part in parts:
                    stream.write_table(part)
        self._buffers.clear()
        self._buffered = 0

    def read(self, shard: int) -> pa.Table:
        """Every row spilled for ``shard`` (flush first)."""
        path = self._path(shard)
        if not os.path.exists(path):
            return self.schema.empty_table()
        tables = []
        with pa.OSFile(path) as handle:
            size = handle.size()
            while handle.tell() < size:
                tables.append(pa.ipc.open_stream(handle).read_all())
        os.unlink(path)  # read once: the disk is given back shard by shard
        return pa.concat_tables(tables) if tables else self.schema.empty_table()


class RankSpill:
    """A shard export's encoded rows on local disk, grouped by export rank so shards are read back in order.

    Every row carries its rank (its position in export order, known from a pass over ``sample_id`` alone) and goes
    to bucket ``rank // bucket_rows`` (a ``ShardSpill`` file, appended in batches); a shard, a range of ranks, is
    read back from its few buckets, sequentially. Rows of a bucket that belong to the next shard are carried over.
    Memory: the spill budget, then one shard plus one bucket."""

    SCHEMA = pa.schema([("shard", pa.int64()), ("rank", pa.int64()), ("members", pa.large_binary())])

    def __init__(self, directory: str, *, bucket_rows: int, budget: int = 16 * 2**20) -> None:
        self.bucket_rows = max(1, bucket_rows)
        self._spill = ShardSpill(directory, self.SCHEMA, budget=budget)
        self._held: list[pa.Table] = []  # buckets read back that hold rows of later shards
        self._next_bucket = 0

    def add(self, ranks: np.ndarray, members: pa.Array) -> None:
        """Rows of one batch: their ranks (int64) and encoded members."""
        ranks = np.asarray(ranks, dtype=np.int64)
        self._spill.add(pa.table([pa.array(ranks // self.bucket_rows), pa.array(ranks), members], schema=self.SCHEMA))

    def finish(self) -> None:
        self._spill.flush()

    def take(self, start: int, count: int) -> pa.Array:
        """The members of ranks ``[start, start + count)`` in rank order (large_binary, one copy out of the
        memory-mapped bucket files); ranges asked in increasing order (skipped ranks are dropped)."""
        end = start + count
        while self._next_bucket <= (end - 1) // self.bucket_rows:
            self._held.append(self._mapped(self._next_bucket))
            self._next_bucket += 1
        rows = pa.concat_tables(self._held) if self._held else self.SCHEMA.empty_table()
        ranks = np.asarray(rows["rank"].combine_chunks()) if rows.num_rows else np.zeros(0, dtype=np.int64)
        inside = np.flatnonzero((ranks >= start) & (ranks < end))
        ordered = inside[np.argsort(ranks[inside], kind="stable")]
        if len(ordered) != count or not np.array_equal(ranks[ordered], np.arange(start, end)):
            raise ValueError(f"spill: ranks {start}..{end - 1} incomplete ({len(ordered)} of {count} rows)")
        # one combined copy of the held rows' members, then the take (Arrow's take over many chunks is slower)
        members = rows["members"].combine_chunks().take(pa.array(ordered))
        # keep (mapped, uncopied) only the buckets that still hold rows of later shards
        self._held = [table for table in self._held
                      if table.num_rows and pc.max(table["rank"]).as_py() >= end]
        return members

    def _mapped(self, bucket: int) -> pa.Table:
        """One bucket's rows, read zero-copy from its memory-mapped file (the file unlinked: its pages go when
        the rows do)."""
        path = self._spill._path(bucket)
        if not os.path.exists(path):
            return self.SCHEMA.empty_table()
        tables = []
        with pa.memory_map(path) as handle:
            size = handle.size()
            while handle.tell() < size:
                tables.append(pa.ipc.open_stream(handle).read_all())
        os.unlink(path)
        return pa.concat_tables(tables) if tables else self.SCHEMA.empty_table()

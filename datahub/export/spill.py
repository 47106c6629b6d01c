"""Group routed rows by shard on local disk, for an export in one process (an engine groups them in a shuffle).

Rows are buffered up to ``budget`` bytes, then every buffered shard gets one Arrow IPC stream appended to its
file (``{dir}/{shard}.arrow``, a file of concatenated streams, opened only while appending). Memory: the
budget plus one shard read back; disk: the encoded release, once.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pyarrow as pa

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

"""Spill files on local disk for exports in one process (an engine groups rows in a shuffle instead).

``RowSpill`` (shard export): encoded rows appended in read order, gathered shard by shard in export order, so the
table's large columns are read once. ``ShardSpill`` (token export): routed rows grouped by shard; rows are buffered
up to ``budget`` bytes, then every buffered shard gets one Arrow IPC stream appended to its file
(``{dir}/{shard}.arrow``, a file of concatenated streams, opened only while appending). Memory: the budget plus
one shard read back; disk: the encoded release, once.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor

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


class RowSpill:
    """A shard export's encoded rows on local disk: appended to one file in read order, each row's place recorded
    by its export rank, so a shard (a range of ranks) is gathered straight into the caller's buffer with one
    positioned read per row.

    Appends go through a writer thread (``os.pwrite`` releases the GIL: the next batch is encoded meanwhile);
    reads never map the file, so the process's memory is the batches in flight plus 16 bytes per row (offset and
    size), whatever the release's size. Disk: the encoded release, once."""

    def __init__(self, directory: str, *, rows: int) -> None:
        self.path = os.path.join(directory, "rows.spill")
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.offsets = np.zeros(rows, dtype=np.int64)  # by export rank: where the row's members begin in the file
        self.sizes = np.zeros(rows, dtype=np.int64)  # by export rank: the row's members' bytes
        self._end = 0
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-spill")
        self._pending: deque[Future[None]] = deque()

    def add(self, ranks: np.ndarray, members: pa.Array) -> None:
        """Rows of one batch: their export ranks (int64) and encoded members (large_binary, no nulls)."""
        count = len(members)
        if not count:
            return
        offsets = np.frombuffer(members.buffers()[1], dtype=np.int64)[members.offset:members.offset + count + 1]
        begin, end = int(offsets[0]), int(offsets[-1])
        self.offsets[ranks] = offsets[:-1] + (self._end - begin)
        self.sizes[ranks] = np.diff(offsets)
        data = members.buffers()[2]
        if end > begin and data is not None:
            self._pending.append(self._writer.submit(_write_at, self._fd, data.slice(begin, end - begin), self._end))
            self._end += end - begin
        while len(self._pending) > 2:  # at most two batches wait for the disk
            self._pending.popleft().result()

    def finish(self) -> None:
        """Wait for the appends (raises the first failed one)."""
        while self._pending:
            self._pending.popleft().result()

    def gather(self, start: int, count: int, into: memoryview) -> int:
        """The members of ranks ``[start, start + count)`` back to back in rank order, read into ``into``; returns
        the bytes written there."""
        fd, preadv, position = self._fd, os.preadv, 0
        for offset, size in zip(self.offsets[start:start + count].tolist(), self.sizes[start:start + count].tolist()):
            if size:
                got = preadv(fd, [into[position:position + size]], offset)
                if got != size:
                    raise OSError(f"spill {self.path}: short read at {offset} ({got} of {size} bytes)")
                position += size
        return position

    def close(self) -> None:
        """Stop the writer and close the file (the caller removes the folder)."""
        self._writer.shutdown(wait=True, cancel_futures=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _write_at(fd: int, data: pa.Buffer, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written

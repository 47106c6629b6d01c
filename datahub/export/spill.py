"""Spill files on local disk for exports in one process (an engine groups rows in a shuffle instead).

``RowSpill`` (shard export): encoded rows appended in read order to files by export-rank bucket, gathered shard by
shard in export order (buckets removed once built), so the table's large columns are read once. ``ShardSpill``
(token export): routed rows grouped by shard; rows are buffered up to ``budget`` bytes, then every buffered shard
gets one Arrow IPC stream appended to its file (``{dir}/{shard}.arrow``, a file of concatenated streams, opened
only while appending). Memory: the budget plus one shard read back; disk: the encoded release, once.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from datahub.errors import IntegrityError

DEFAULT_BUDGET = 64 * 2**20
# RowSpill's buckets: ~8 MB of encoded rows each (a shard frees its buckets soon after it is built), at most 256
# files open at once (a common soft limit on open files is 1024; a release past ~2 GB gets larger buckets)
BUCKET_BYTES = 8 * 2**20
MAX_BUCKETS = 256
_MAX_GAP = 1 << 20  # bytes of other rows read through (into scratch) rather than skipped by a new read
_IOV_MAX = 1024  # Linux's limit on buffers per pwritev


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
    """A shard export's encoded rows on local disk, bucketed by export rank: each bucket (a range of
    ``bucket_rows`` ranks) is a file of its rows appended in read order, each row's place recorded by its export
    rank, so a shard (a range of ranks) is gathered straight into the caller's buffer with one vectored read per
    bucket (``gather``), and the buckets of shards already built are removed (``release``) as the export goes.

    Removing them frees their page-cache pages while the shards are written, so the shard files reuse pages that
    were just in use instead of touching fresh memory (on a virtual machine that returns free memory to its host,
    fresh pages cost a host fault each: writing a new file ran at ~80 MB/s there against ~2.5 GB/s into pages
    just freed); the spill's disk space goes back as well. Appends go through a writer thread (``os.pwrite``
    releases the GIL: the next batch is encoded meanwhile); reads never map the files, so the process's memory is
    the batches in flight plus 16 bytes per row (offset and size), whatever the release's size. Disk: the encoded
    release, once, less what was released."""

    def __init__(self, directory: str, *, rows: int, bucket_bytes: int = BUCKET_BYTES,
                 max_buckets: int = MAX_BUCKETS) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "rows.spill")  # the bucket files' prefix
        self.offsets = np.zeros(rows, dtype=np.int64)  # by export rank: where the row's members begin in its bucket
        self.sizes = np.zeros(rows, dtype=np.int64)  # by export rank: the row's members' bytes
        self._rows = rows
        self._bucket_bytes = bucket_bytes
        self._max_buckets = max_buckets
        self.bucket_rows = 0  # chosen at the first add, from the first batch's bytes per row
        self._fds: list[int] = []  # per bucket; -1 once released
        self._ends: list[int] = []  # per bucket: bytes appended
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-spill")
        self._pending: deque[Future[None]] = deque()

    def _open(self, first: pa.LargeBinaryArray) -> None:
        per_row = max(1, first.buffers()[2].size // max(len(first), 1) if first.buffers()[2] is not None else 1)
        bucket_rows = max(1, self._bucket_bytes // per_row, -(-self._rows // self._max_buckets))
        self.bucket_rows = bucket_rows
        count = -(-self._rows // bucket_rows)
        self._fds = [os.open(f"{self.path}.{b:06d}", os.O_CREAT | os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                     for b in range(count)]
        self._ends = [0] * count

    def add(self, ranks: np.ndarray, members: pa.Array) -> None:
        """Rows of one batch: their export ranks (int64) and encoded members (large_binary, no nulls)."""
        count = len(members)
        if not count:
            return
        if not self.bucket_rows:
            self._open(members)
        buckets = np.asarray(ranks, dtype=np.int64) // self.bucket_rows
        order = np.argsort(buckets, kind="stable")  # by bucket, read order within one
        ranks, buckets = np.asarray(ranks)[order], buckets[order]
        offsets = np.frombuffer(members.buffers()[1], dtype=np.int64)[members.offset:members.offset + count + 1]
        starts, sizes = offsets[:-1][order], np.diff(offsets)[order]
        data = members.buffers()[2]
        view = memoryview(data) if data is not None else memoryview(b"")
        cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
        firsts, lasts = np.concatenate([[0], cuts]), np.concatenate([cuts, [count]])
        # each row's place: its bucket's end so far plus the rows before it in this batch's run of that bucket
        ends = np.asarray(self._ends, dtype=np.int64)
        within = np.cumsum(sizes) - sizes
        run_starts = within[firsts]
        placed = within - np.repeat(run_starts, lasts - firsts) + np.repeat(ends[buckets[firsts]], lasts - firsts)
        self.offsets[ranks] = placed
        self.sizes[ranks] = sizes
        slices = [view[o:o + n] for o, n in zip(starts.tolist(), sizes.tolist())]
        jobs: list[tuple[int, list[memoryview], int]] = []
        for first, last, bucket in zip(firsts.tolist(), lasts.tolist(), buckets[firsts].tolist()):
            parts = [part for part in slices[first:last] if len(part)]
            if parts:
                # the rows' slices of the batch's buffer, written with one pwritev (no gathered copy)
                jobs.append((self._fds[bucket], parts, self._ends[bucket]))
                self._ends[bucket] += sum(len(part) for part in parts)
        if jobs:  # one task per batch: a task per bucket cost ~25 us each of the main thread (256 buckets a batch)
            self._pending.append(self._writer.submit(_write_jobs, jobs))
        while len(self._pending) > 2:  # about two batches wait for the disk
            self._pending.popleft().result()

    def finish(self) -> None:
        """Wait for the appends and removals queued so far (raises the first failed one)."""
        while self._pending:
            self._pending.popleft().result()

    def gather(self, start: int, count: int, into: memoryview) -> int:
        """The members of ranks ``[start, start + count)`` back to back in rank order, read into ``into``; returns
        the bytes written there.

        Bucket by bucket, the file range that holds the wanted rows is read in file order with ``os.preadv`` into
        as many buffers: each wanted row's place in ``into``, and a scratch buffer for the rows of other ranks
        between them. One copy from the page cache and a system call per ``_IOV_MAX`` rows, not one per row."""
        end = start + count
        if count <= 0:
            return 0
        sizes = self.sizes[start:end]
        places = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(sizes, out=places[1:])
        total = int(places[-1])
        if total > len(into):
            raise ValueError(f"spill {self.path}: ranks [{start}, {end}) hold {total} bytes, the buffer {len(into)}")
        bucket_rows = self.bucket_rows or 1
        for bucket in range(start // bucket_rows, (end - 1) // bucket_rows + 1):
            low, high = bucket * bucket_rows, min((bucket + 1) * bucket_rows, self._rows)
            fd = self._fds[bucket] if bucket < len(self._fds) else -1
            if fd < 0:
                if not self.sizes[max(low, start):min(high, end)].any():
                    continue  # nothing was spilled there (an empty release or rows of no bytes)
                raise IntegrityError(f"spill {self.path}: ranks [{max(low, start)}, {min(high, end)}) were gathered "
                                     "after their bucket was released")
            self._gather_bucket(fd, low, high, start, end, places, into)
        return total

    def _gather_bucket(self, fd: int, low: int, high: int, start: int, end: int, places: np.ndarray,
                       into: memoryview) -> None:
        """Ranks ``[max(low, start), min(high, end))`` of the bucket holding ranks ``[low, high)`` into their places."""
        offsets, sizes = self.offsets[low:high], self.sizes[low:high]
        order = np.argsort(offsets, kind="stable")  # the bucket's rows in file order (back to back from 0)
        wanted = (order + low >= start) & (order + low < end) & (sizes[order] > 0)
        if not wanted.any():
            return
        first, last = np.flatnonzero(wanted)[[0, -1]].tolist()
        run = order[first:last + 1]  # the file range from the first wanted row to the last
        run = run[sizes[run] > 0]
        run_sizes = sizes[run]
        inside = (run + low >= start) & (run + low < end)
        skipped = run_sizes[~inside]
        scratch = memoryview(bytearray(int(skipped.max()))) if len(skipped) else into[:0]
        run_places = np.where(inside, places[np.clip(run + low - start, 0, len(places) - 1)], 0)
        parts = [into[p:p + n] if keep else scratch[:n]
                 for keep, p, n in zip(inside.tolist(), run_places.tolist(), run_sizes.tolist())]
        # one read per stretch of the file: a gap of more than _MAX_GAP bytes of other ranks' rows between two wanted
        # rows starts a new read (a shuffled release over MAX_BUCKETS buckets spreads a shard over whole buckets:
        # reading through them would read each bucket once per shard)
        kept = np.flatnonzero(inside)
        skipped_before = np.cumsum(np.where(inside, 0, run_sizes))
        breaks = np.flatnonzero(skipped_before[kept[1:]] - skipped_before[kept[:-1]] > _MAX_GAP)
        firsts = np.concatenate((kept[:1], kept[breaks + 1])).tolist()
        ends = (np.concatenate((kept[breaks], kept[-1:])) + 1).tolist()
        preadv = os.preadv
        for a, b in zip(firsts, ends):
            position = int(offsets[run[a]])
            for begin in range(a, b, _IOV_MAX):
                chunk = parts[begin:min(begin + _IOV_MAX, b)]
                want = int(run_sizes[begin:min(begin + _IOV_MAX, b)].sum())
                if preadv(fd, chunk, position) != want:  # a short read (rare): again, buffer by buffer
                    cursor = position
                    for part in chunk:
                        _read_at(fd, part, cursor)
                        cursor += len(part)
                position += want

    def release(self, below: int) -> None:
        """Ranks below ``below`` will not be gathered again: remove the buckets that hold only such ranks (on the
        writer thread, right away: their page-cache pages are freed for the shard files to reuse)."""
        if not self.bucket_rows:
            return
        for bucket in range(min(below // self.bucket_rows, len(self._fds))):
            if self._fds[bucket] >= 0:
                os.close(self._fds[bucket])
                self._fds[bucket] = -1
                # on the (by now idle) writer thread: removing a file frees its pages, ~3 ms per 8 MB bucket
                self._pending.append(self._writer.submit(_remove, f"{self.path}.{bucket:06d}"))

    def close(self) -> None:
        """Stop the writer and close the files (the caller removes the folder)."""
        self._writer.shutdown(wait=True, cancel_futures=True)
        for bucket, fd in enumerate(self._fds):
            if fd >= 0:
                os.close(fd)
                self._fds[bucket] = -1


def _write_jobs(jobs: list[tuple[int, list[memoryview], int]]) -> None:
    for fd, parts, offset in jobs:
        _write_parts_at(fd, parts, offset)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_parts_at(fd: int, parts: list[memoryview], offset: int) -> None:
    """``parts`` back to back at ``offset``: ``os.pwritev`` in runs of at most ``_IOV_MAX`` buffers."""
    for begin in range(0, len(parts), _IOV_MAX):
        run = parts[begin:begin + _IOV_MAX]
        total = sum(len(part) for part in run)
        written = os.pwritev(fd, run, offset)
        if written < total:  # a short write (rare): the rest one buffer at a time
            skip = written
            for part in run:
                if skip >= len(part):
                    skip -= len(part)
                    continue
                _write_at(fd, part[skip:], offset + written)
                written += len(part) - skip
                skip = 0
        offset += total


def _read_at(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        got = os.preadv(fd, [view], offset)
        if got <= 0:
            raise OSError(f"short read at {offset}: the spill file ended early")
        view, offset = view[got:], offset + got


def _write_at(fd: int, data: pa.Buffer | memoryview, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written

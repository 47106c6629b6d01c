"""Spill files on local disk for exports in one process (an engine groups rows in a shuffle instead).

``BucketSpill`` (shard export): encoded rows appended in read order to files by key bucket, gathered shard by shard
in export order (buckets removed once built), so the table's large columns are read once; ``RecordSpill``: the
rows' small records (id, order hash, place) by bucket, for the plan sorted bucket by bucket. ``ShardSpill``
(token export): routed rows grouped by shard; rows are buffered up to ``budget`` bytes, then every buffered shard
gets one Arrow IPC stream (one record batch) appended to its file (``{dir}/{shard}.arrow``, a file of concatenated
streams, opened only while appending). Memory: the budget plus one shard read back (the token export routes to
runs of a file's export order, so a shard here is bounded); disk: the encoded release, once.
"""

from __future__ import annotations

import os
import resource
from collections import defaultdict, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from datahub.errors import IntegrityError

DEFAULT_BUDGET = 64 * 2**20
# BucketSpill's buckets: up to 16 MiB of encoded rows each, half a shard at most and 8 MiB at least (a shard frees its
# buckets soon after it is built), at least 256 files open at once allowed (a common soft limit on open files is 1024;
# half the soft limit when that is more). Each bucket costs three files (spill, records, sorted records), created and
# removed per export, and a create in a scratch folder of a busy ext4 costs ~0.3-1 ms (its recently deleted inodes are
# skipped one by one): L of benchmarks/release_scale.py (2.5 GB, 32 MB shards), 294 buckets of 8 MiB vs 148 of 16 MB,
# alternated, load 3.8-5.6: CPU 7.47 / 7.49 -> 6.70 / 6.81 s, main thread 3.49 / 3.49 -> 3.19 / 3.09 s; buckets of a
# whole shard (32 MB) gather each shard's rows through the next shard's (write phase 2.76 / 4.69 s vs 2.46 / 2.32)
BUCKET_BYTES = 16 * 2**20
MIN_BUCKET_BYTES = 8 * 2**20
MAX_BUCKETS = 256


def bucket_bytes(shard_size: int | None) -> int:
    """Encoded rows per spill bucket for shards of ``shard_size`` bytes (None: cut by sample count): ``BUCKET_BYTES``,
    or half a shard when that is less, ``MIN_BUCKET_BYTES`` at least. A bucket of a shard or more spans two shards and
    each of them reads the other's rows in it (``BucketSpill.gather`` reads through gaps)."""
    if shard_size is None:
        return BUCKET_BYTES
    return max(MIN_BUCKET_BYTES, min(BUCKET_BYTES, shard_size // 2))


def buckets_allowed() -> int:
    """Buckets of a plan at most: ``MAX_BUCKETS``, or half the soft limit on open files when that is more (an export
    in this process keeps every spill bucket open)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(MAX_BUCKETS, soft // 2) if soft != resource.RLIM_INFINITY else MAX_BUCKETS


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
        """Append every buffered shard's rows to its file as one record batch (a shard's slices of every batch
        added, joined: rows spread over many shards would otherwise make batches of a few rows each, their IPC
        metadata outweighing them on disk and when read back)."""
        while self._buffers:
            shard, parts = self._buffers.popitem()
            joined = (pa.concat_tables(parts) if len(parts) > 1 else parts[0]).combine_chunks()
            del parts
            with open(self._path(shard), "ab") as handle, pa.ipc.new_stream(handle, self.schema) as stream:
                stream.write_table(joined)
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


class BucketSpill:
    """A shard export's encoded rows on local disk by key bucket (``datahub.export.plan.KeyBuckets``): each bucket
    a file of its rows appended in read order; ``add`` says where each row went (the plan's records keep it), a
    shard's rows of a bucket are read straight into the caller's buffer (``gather``: one vectored read per stretch
    of the file), and a bucket is removed once its rows are all built (``release``).

    Removing them frees their page-cache pages while the shards are written, so the shard files reuse pages that
    were just in use instead of touching fresh memory (on a virtual machine that returns free memory to its host,
    fresh pages cost a host fault each: writing a new file ran at ~80 MB/s there against ~2.5 GB/s into pages
    just freed); the spill's disk space goes back as well. Appends go through a writer thread (``os.pwrite``
    releases the GIL: the next batch is encoded meanwhile); reads never map the files, and nothing per row is
    held here. Disk: the encoded release, once, less what was released."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "rows.spill")  # the bucket files' prefix
        self._fds: list[int] = []  # per bucket; -1 once released
        self._ends: list[int] = []  # per bucket: bytes appended
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-spill")
        self._pending: deque[Future[None]] = deque()

    def open(self, buckets: int) -> None:
        self._fds = [os.open(f"{self.path}.{b:06d}", os.O_CREAT | os.O_RDWR | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                     for b in range(buckets)]
        self._ends = [0] * buckets

    def add(self, buckets: np.ndarray, members: pa.Array | Sequence[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
        """Rows of one batch: their buckets (int64) and their bytes, as one large_binary array (no nulls) or as
        several aligned ones (a row's bytes are its values back to back, a null adds none: an export's member data,
        column by column, written from the batch's own buffers without joining them first); returns each row's offset
        in its bucket's file and its bytes (int64, in the batch's order)."""
        parts = [members] if isinstance(members, pa.Array) else list(members)
        count = len(parts[0]) if parts else 0
        if not count:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        order = np.argsort(buckets, kind="stable")  # by bucket, read order within one
        sorted_buckets = np.asarray(buckets, dtype=np.int64)[order]
        starts = np.empty((count, len(parts)), dtype=np.int64)  # per row (in bucket order) and part
        sizes = np.empty((count, len(parts)), dtype=np.int64)
        views: list[memoryview] = []
        for column, part in enumerate(parts):
            offsets = np.frombuffer(part.buffers()[1], dtype=np.int64)[part.offset:part.offset + count + 1]
            lengths = np.diff(offsets)
            if part.null_count:
                lengths = np.where(np.asarray(part.is_valid()), lengths, 0)
            starts[:, column], sizes[:, column] = offsets[:-1][order], lengths[order]
            data = part.buffers()[2]
            views.append(memoryview(data) if data is not None else memoryview(b""))
        row_sizes = sizes.sum(axis=1)  # in bucket order
        cuts = np.flatnonzero(sorted_buckets[1:] != sorted_buckets[:-1]) + 1
        firsts, lasts = np.concatenate([[0], cuts]), np.concatenate([cuts, [count]])
        ends = np.asarray(self._ends, dtype=np.int64)
        within = np.cumsum(row_sizes) - row_sizes
        placed = within - np.repeat(within[firsts], lasts - firsts) + \
            np.repeat(ends[sorted_buckets[firsts]], lasts - firsts)
        places = np.empty(count, dtype=np.int64)
        places[order] = placed
        bytes_of = np.empty(count, dtype=np.int64)
        bytes_of[order] = row_sizes
        # the rows' values as slices of the batch's buffers (empty ones left out), row after row in bucket order
        kept = sizes.reshape(-1) > 0
        columns = np.tile(np.arange(len(parts)), count)[kept].tolist()
        slices = [views[c][o:o + n] for c, o, n in zip(columns, starts.reshape(-1)[kept].tolist(),
                                                         sizes.reshape(-1)[kept].tolist())]
        slice_ends = np.concatenate([[0], np.cumsum((sizes > 0).sum(axis=1))])  # per row: its slices end here
        jobs: list[tuple[int, list[memoryview], int]] = []
        run_bytes = np.add.reduceat(row_sizes, firsts).tolist()
        for first, last, bucket, written in zip(slice_ends[firsts].tolist(), slice_ends[lasts].tolist(),
                                                sorted_buckets[firsts].tolist(), run_bytes):
            if written:  # the rows' slices of the batch's buffers, written with one pwritev (no gathered copy)
                jobs.append((self._fds[bucket], slices[first:last], self._ends[bucket]))
                self._ends[bucket] += written
        if jobs:  # one task per batch: a task per bucket cost ~25 us each of the main thread
            self._pending.append(self._writer.submit(_write_jobs, jobs))
        while len(self._pending) > 2:  # about two batches wait for the disk
            self._pending.popleft().result()
        return places, bytes_of

    def finish(self) -> None:
        """Wait for the appends and removals queued so far (raises the first failed one)."""
        while self._pending:
            self._pending.popleft().result()

    def gather(self, bucket: int, offsets: np.ndarray, sizes: np.ndarray, places: np.ndarray,
               into: memoryview) -> None:
        """Rows of ``bucket`` (their ``offsets`` and ``sizes`` in its file) into ``into`` at ``places``: in file
        order with ``os.preadv``, reading through gaps of other rows (into scratch) up to ``_MAX_GAP`` bytes."""
        keep = np.asarray(sizes) > 0
        if not keep.any():
            return
        fd = self._fds[bucket] if bucket < len(self._fds) else -1
        if fd < 0:
            raise IntegrityError(f"spill {self.path}: bucket {bucket} was gathered after it was released")
        order = np.argsort(np.asarray(offsets)[keep], kind="stable")
        offsets, sizes, places = (np.asarray(a, dtype=np.int64)[keep][order] for a in (offsets, sizes, places))
        gaps = offsets[1:] - (offsets[:-1] + sizes[:-1])
        through = gaps <= _MAX_GAP
        scratch_bytes = int(gaps[through].max()) if through.any() else 0
        scratch = memoryview(bytearray(scratch_bytes)) if scratch_bytes else into[:0]
        # the buffers of one read, in file order: each row's place in ``into``, and before a row the gap of other
        # rows read through (into scratch); a gap over _MAX_GAP starts a new read
        gap_before = np.concatenate([[0], np.where(through, gaps, 0)])
        new_read = np.concatenate([[True], ~through])
        with_gap = gap_before > 0
        count = len(offsets) + int(with_gap.sum())
        slot = np.arange(len(offsets)) + np.cumsum(with_gap)  # each row's buffer
        is_row = np.zeros(count, dtype=bool)
        is_row[slot] = True
        starts = np.zeros(count, dtype=np.int64)
        lengths = np.zeros(count, dtype=np.int64)
        starts[slot], lengths[slot] = places, sizes
        lengths[slot[with_gap] - 1] = gap_before[with_gap]
        parts = [into[p:p + n] if row else scratch[:n]
                 for row, p, n in zip(is_row.tolist(), starts.tolist(), lengths.tolist())]
        read_starts = np.flatnonzero(new_read)
        firsts = (slot[read_starts] - with_gap[read_starts]).tolist()  # a read never begins with a gap
        lasts = np.concatenate([slot[read_starts[1:]] - with_gap[read_starts[1:]], [count]]).tolist()
        positions = offsets[read_starts].tolist()
        cumulative = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        preadv = os.preadv
        for first, last, position in zip(firsts, lasts, positions):
            for begin in range(first, last, _IOV_MAX):
                end = min(begin + _IOV_MAX, last)
                chunk = parts[begin:end]
                want = cumulative[end] - cumulative[begin]
                if preadv(fd, chunk, position) != want:  # a short read (rare): again, buffer by buffer
                    cursor = position
                    for part in chunk:
                        _read_at(fd, part, cursor)
                        cursor += len(part)
                position += want

    def release(self, bucket: int) -> None:
        """``bucket``'s rows will not be gathered again: remove its file (on the writer thread)."""
        if bucket < len(self._fds) and self._fds[bucket] >= 0:
            os.close(self._fds[bucket])
            self._fds[bucket] = -1
            self._pending.append(self._writer.submit(_remove, f"{self.path}.{bucket:06d}"))

    def close(self) -> None:
        """Stop the writer and close the files (the caller removes the folder)."""
        self._writer.shutdown(wait=True, cancel_futures=True)
        for bucket, fd in enumerate(self._fds):
            if fd >= 0:
                os.close(fd)
                self._fds[bucket] = -1


class RecordSpill:
    """Small per-row records (a table) grouped by bucket on local disk: buffered up to ``budget`` bytes, then grouped
    by bucket and appended to one file (``{dir}/records.arrow``), an Arrow IPC stream per bucket and flush; where each
    lies is kept here (three int64 per bucket and flush). One file, not one per bucket: a create in a scratch folder of
    a busy ext4 costs ~0.3-1 ms (its recently deleted inodes are skipped one by one), and a plan has hundreds of
    buckets. The file is removed once every bucket in it was read."""

    def __init__(self, directory: str, *, budget: int = 16 * 2**20) -> None:
        self.directory = directory
        self.path = os.path.join(directory, "records.arrow")
        self.budget = budget
        self._buffered: list[tuple[np.ndarray, pa.Table]] = []
        self._bytes = 0
        # per flush: its buckets (ascending), where each one's stream starts and ends in the file, and whether read
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, buckets: np.ndarray, records: pa.Table) -> None:
        if not records.num_rows:
            return
        self._buffered.append((np.asarray(buckets, dtype=np.int64), records))
        self._bytes += records.nbytes
        if self._bytes >= self.budget:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        buckets = np.concatenate([b for b, _ in self._buffered])
        records = pa.concat_tables([r for _, r in self._buffered])
        self._buffered, self._bytes = [], 0
        order = np.argsort(buckets, kind="stable")
        grouped, buckets = records.take(pa.array(order)), buckets[order]
        del records
        cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
        firsts = np.concatenate([[0], cuts]).astype(np.int64)
        lasts = np.concatenate([cuts, [len(buckets)]]).astype(np.int64)
        starts = np.zeros(len(firsts), dtype=np.int64)
        ends = np.zeros(len(firsts), dtype=np.int64)
        with open(self.path, "ab") as handle:
            for run, (begin, end) in enumerate(zip(firsts.tolist(), lasts.tolist())):
                starts[run] = handle.tell()
                with pa.ipc.new_stream(handle, grouped.schema) as stream:
                    stream.write_table(grouped.slice(begin, end - begin))
                ends[run] = handle.tell()
        self._parts.append((buckets[firsts], starts, ends, np.zeros(len(firsts), dtype=bool)))

    def read(self, bucket: int) -> pa.Table | None:
        """Every record of ``bucket`` not read before (flush first), or None; the file is removed once every bucket
        in it was read."""
        ranges: list[tuple[int, int]] = []
        for buckets, starts, ends, taken in self._parts:
            at = int(np.searchsorted(buckets, bucket))
            if at < len(buckets) and buckets[at] == bucket and not taken[at]:
                ranges.append((int(starts[at]), int(ends[at])))
                taken[at] = True
        if not ranges:
            return None
        tables = []
        with pa.OSFile(self.path) as handle:
            for start, end in ranges:
                tables.append(pa.ipc.open_stream(handle.read_at(end - start, start)).read_all())
        if all(taken.all() for *_, taken in self._parts):
            os.unlink(self.path)  # read once: the disk is given back (a later flush starts a new file)
            self._parts = []
        return pa.concat_tables(tables)


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

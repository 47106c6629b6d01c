"""Plan an export on the driver: the order of samples and where shards begin, from sample ids and sizes only.

The sizes come from the rows' encoded members (an export in one process) or from a pass of the engine's tasks over
``sample_id``, the small columns that make the ``.json`` member and the byte lengths of ``text`` and binary columns
(``pc.binary_length`` in the scan; ``member_bytes``): per sample the id, its order key and its size in the shard,
never the text. An ``ExportPlan`` holds those in memory (~100 bytes a sample for a 64-character id: the token
export, and the reference the tests compare with); the text exports plan on local disk instead, bucket by bucket
(``BucketPlan``: in one process from the rows, on an engine from its tasks' summaries, ``SummaryPlan``).

Export order:
- no seed: by ``sample_id`` (byte order), as every export has been;
- ``shuffle_seed``: by ``(order_hash(sample_id, seed), sample_id)``, a keyed hash computed per row, so any task
  that sees a row knows its place without a global permutation. ``order_hash`` is "keyed-fnv1a64-v1":
  FNV-1a 64 over the UTF-8 bytes of the id, starting from the FNV offset basis XOR fmix64(seed mod 2**64),
  finished by MurmurHash3's fmix64 (FNV: http://www.isthe.com/chongo/tech/comp/fnv/, fmix64:
  https://github.com/aappleby/smhasher MurmurHash3.cpp). Exports made before it (a numpy permutation of the
  sorted ids) keep their manifests and shards; they read as before.

Shards are contiguous ranges of that order, so a shard is named by its first key: a writer routes any row to
its shard with a binary search over the shards' first keys (``ExportPlan.route``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import IntegrityError
from datahub.export.samples import KEY_COLUMN, TEXT_COLUMN, json_records
from datahub.export.spill import RecordSpill
from datahub.shards.tar import BLOCK, RECORD, check_key

ORDER = "keyed-fnv1a64-v1"
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
# bounds on the __index__ member's size: key (<= 90 chars) and newline per sample; its header, trailer,
# extension list and padding once per shard
_INDEX_PER_SAMPLE = 91
_INDEX_FIXED = 3 * BLOCK + 255 * 10
_MIN_SAMPLE_BYTES = 2 * BLOCK  # every sample has a .txt and a .json member: a header each at least


def index_reserve(member_bytes: np.ndarray | int, samples: np.ndarray | int) -> np.ndarray | int:
    """The most bytes the ``__index__`` member of a shard with these members can take: 10 index bytes per
    member (a member is at least one 512-byte block), a key (<= 90 characters) and newline per sample,
    and once its header, trailer, extension list (<= 255 names) and padding. Works on ints and arrays."""
    return _INDEX_FIXED + (member_bytes * 10 + BLOCK - 1) // BLOCK + samples * _INDEX_PER_SAMPLE


def _fmix64(values: np.ndarray) -> np.ndarray:
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xFF51AFD7ED558CCD)
    values = values ^ (values >> np.uint64(33))
    values = values * np.uint64(0xC4CEB9FE1A85EC53)
    return values ^ (values >> np.uint64(33))


def order_hash(ids: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """The keyed order hash of every id (uint64), vectorized: one numpy pass per byte position of the ids."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    ids = ids.cast(pa.large_binary())
    n = len(ids)
    start = np.full(n, _fmix64(np.array([seed & (2**64 - 1)], dtype=np.uint64))[0] ^ _FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return start
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset:ids.offset + n + 1]
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8)
    lengths = np.diff(offsets)
    hashes = start
    width = int(lengths.max())
    if int(lengths.min()) == width:  # ids of one length (content hashes): a matrix, no masks
        matrix = data[offsets[0]:offsets[-1]].reshape(n, width)
        for column in range(width):
            hashes = (hashes ^ matrix[:, column]) * _FNV_PRIME
    else:
        begins = offsets[:-1]
        for column in range(width):
            active = np.flatnonzero(lengths > column)
            hashes[active] = (hashes[active] ^ data[begins[active] + column]) * _FNV_PRIME
    return _fmix64(hashes)


def member_bytes(batch: pa.RecordBatch, *, json_columns: list[str], binary: list[str]) -> np.ndarray:
    """Bytes each row takes in a shard (its members' headers, data and padding), from ``{column}`` lengths:
    ``text`` and binary columns arrive as their byte lengths (null: no member), the rest as values."""
    def span(sizes: np.ndarray) -> np.ndarray:
        return BLOCK + sizes + (-sizes % BLOCK)

    n = batch.num_rows
    if TEXT_COLUMN in batch.schema.names:
        text = np.asarray(pc.fill_null(batch.column(TEXT_COLUMN), 0), dtype=np.int64)
    else:
        text = np.zeros(n, dtype=np.int64)
    records = np.asarray(pc.binary_length(json_records(batch, json_columns)), dtype=np.int64)
    total = span(text) + span(records)
    for column in binary:
        lengths = batch.column(column)
        total += np.where(np.asarray(pc.is_valid(lengths)), span(np.asarray(pc.fill_null(lengths, 0), dtype=np.int64)), 0)
    return total


@dataclass(frozen=True)
class ShardSpan:
    index: int
    start: int  # position of the shard's first sample in export order
    samples: int


@dataclass(frozen=True)
class ExportPlan:
    """Sample ids in export order, their order hashes (seeded export) and sizes, and the shard ranges."""

    ids: pa.Array
    hashes: np.ndarray | None
    sizes: np.ndarray
    spans: tuple[ShardSpan, ...]

    @property
    def num_samples(self) -> int:
        return len(self.ids)

    def shard_ids(self, index: int) -> pa.Array:
        span = self.spans[index]
        return self.ids.slice(span.start, span.samples)

    def shard_member_bytes(self, index: int) -> int:
        span = self.spans[index]
        return int(self.sizes[span.start:span.start + span.samples].sum())

    def id_chunks(self) -> Iterator[pa.Array]:
        """The ids in export order, a slice at a time."""
        for start in range(0, len(self.ids), 65_536):
            yield self.ids.slice(start, 65_536)

    def router(self) -> ShardRouter:
        starts = [s.start for s in self.spans]
        first_ids = np.asarray(self.ids.take(pa.array(starts, pa.int64())).to_pylist(), dtype=object) if starts else \
            np.asarray([], dtype=object)
        first_hashes = self.hashes[starts] if self.hashes is not None else None
        return ShardRouter(first_ids.astype(bytes) if len(first_ids) else np.asarray([], dtype="S1"), first_hashes,
                           tuple(s.samples for s in self.spans))


@dataclass(frozen=True)
class ShardRouter:
    """The shards' first keys: small (one per shard), picklable, sent to every writer task."""

    first_ids: np.ndarray  # bytes (numpy S), one per shard
    first_hashes: np.ndarray | None  # uint64 per shard, seeded exports
    samples: tuple[int, ...]

    def route(self, ids: pa.Array | pa.ChunkedArray, hashes: np.ndarray | None) -> np.ndarray:
        """The shard of every row (int64): the last shard whose first key is <= the row's key."""
        keys = _as_keys(ids)
        if self.first_hashes is None or hashes is None:
            return np.searchsorted(self.first_ids, keys, side="right").astype(np.int64) - 1
        shard = np.searchsorted(self.first_hashes, hashes, side="right").astype(np.int64) - 1
        # a row whose hash equals a shard's first hash is ordered by id among those (ties: ~n^2/2^65)
        ties = np.flatnonzero(self.first_hashes[np.maximum(shard, 0)] == hashes)
        for row in ties.tolist():
            low = int(np.searchsorted(self.first_hashes, hashes[row], side="left"))
            high = int(shard[row]) + 1
            within = int(np.searchsorted(self.first_ids[low:high], keys[row], side="right"))
            shard[row] = low + within - 1
        return shard


def checked_ids(ids: pa.Array | pa.ChunkedArray, *, where: str) -> pa.Array | pa.ChunkedArray:
    """A batch's sample ids as strings, refused when one is null or not a valid shard key."""
    if ids.null_count:
        raise IntegrityError(f"{where}: rows have a null sample_id; fix the table before exporting")
    bad = pc.invert(pc.match_substring_regex(ids, r"^[A-Za-z0-9_-]{1,90}$"))
    if pc.any(bad).as_py():
        check_key(pc.filter(ids, bad)[0].as_py(), where=where)
    return ids.cast(pa.string())


def plan_sizes(id_chunks: list[pa.Array], size_chunks: list[np.ndarray], *, shuffle_seed: int | None,
               shard_size: int | None, shard_samples: int | None, where: str) -> ExportPlan:
    """Order the samples (ids and shard bytes each, in read order) and cut shards."""
    ids = pa.chunked_array(id_chunks, pa.string()).combine_chunks() if id_chunks else pa.array([], pa.string())
    sizes = np.concatenate(size_chunks) if size_chunks else np.zeros(0, dtype=np.int64)
    ordered, hashes, positions = export_ordering(ids, shuffle_seed=shuffle_seed, where=where)
    sizes = sizes[positions]
    spans = cut_shards(sizes, shard_size=shard_size, shard_samples=shard_samples)
    return ExportPlan(ordered, hashes, sizes, spans)


def export_ordering(ids: pa.Array, *, shuffle_seed: int | None, where: str) -> tuple[pa.Array, np.ndarray | None, np.ndarray]:
    """Ids (in read order) put in export order: the ordered ids, their order hashes (seeded) and each one's read
    position (int64); refused when an id repeats."""
    hashes = order_hash(ids, shuffle_seed) if shuffle_seed is not None else None
    if hashes is None:
        order = pc.sort_indices(ids)
    else:
        order = pc.sort_indices(pa.table({"h": hashes, "id": ids}), sort_keys=[("h", "ascending"), ("id", "ascending")])
    ordered = ids.take(order)
    _check_unique(ordered, where)
    positions = np.asarray(order).astype(np.int64, copy=False)
    return ordered, hashes[positions] if hashes is not None else None, positions


def _check_unique(ordered: pa.Array, where: str) -> None:
    """Equal ids are neighbours in either order (equal ids have equal hashes)."""
    if len(ordered) < 2:
        return
    repeats = _repeats(ordered)
    if repeats:
        raise _not_unique(where, len(ordered), len(ordered) - repeats)


def _repeats(ordered: pa.Array | pa.ChunkedArray) -> int:
    """How many ids equal the one before them (ids in either export order)."""
    if len(ordered) < 2:
        return 0
    return int(pc.sum(pc.equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))).as_py() or 0)


def _not_unique(where: str, rows: int, distinct: int) -> IntegrityError:
    return IntegrityError(f"{where}: sample_id is not unique ({rows} rows, {distinct} distinct ids): a shard key must "
                          "name one sample; add exact dedup to the job graph (or release a deduplicated table "
                          "version) before exporting")


def cut_shards(sizes: np.ndarray, *, shard_size: int | None, shard_samples: int | None) -> tuple[ShardSpan, ...]:
    """Cut samples (bytes each, in order) into shards. A shard closes before the sample that would take it past
    ``shard_size`` or at ``shard_samples``; a shard holds at least one sample (which alone may be larger).

    The size counts the whole file: the ``__index__`` member (see ``datahub.shards.index``), the
    end-of-archive blocks and the padding to a full tar record, so a shard takes samples while their
    members, ``index_reserve(members, count)`` and 1024 bytes of end blocks stay within ``shard_size``
    rounded down to a record. One numpy search per shard over a window of at most ``shard_size / 1 KiB``."""
    spans: list[ShardSpan] = []
    start = 0
    for take in cut_takes(sizes, shard_size=shard_size, shard_samples=shard_samples, final=True):
        spans.append(ShardSpan(len(spans), start, take))
        start += take
    return tuple(spans)


def cut_lookahead(*, shard_size: int | None, shard_samples: int | None) -> int | None:
    """How many samples past a shard's start decide where it ends (None: all of them): a plan cut in pieces
    (``cut_takes(final=False)``) closes a shard only when that many samples follow its start."""
    limits = []
    if shard_samples is not None:
        limits.append(shard_samples)
    if shard_size is not None:
        budget = (shard_size // RECORD) * RECORD - 2 * BLOCK - _INDEX_FIXED
        limits.append(max(budget, 0) // _MIN_SAMPLE_BYTES + 1)
    return min(limits) if limits else None


def cut_takes(sizes: np.ndarray, *, shard_size: int | None, shard_samples: int | None, final: bool) -> list[int]:
    """The samples of each shard cut from the start of ``sizes`` (see ``cut_shards``). Not ``final``: more samples
    follow, so shards stop where fewer than ``cut_lookahead`` samples are left (those wait for the next piece);
    the shards cut are the ones ``cut_shards`` cuts from the whole."""
    total = len(sizes)
    cumulative = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    budget = (shard_size // RECORD) * RECORD - 2 * BLOCK - _INDEX_FIXED if shard_size is not None else 0
    lookahead = cut_lookahead(shard_size=shard_size, shard_samples=shard_samples)
    takes: list[int] = []
    start = 0
    while start < total:
        if not final and (lookahead is None or total - start < lookahead):
            break
        take = total - start
        if shard_samples is not None:
            take = min(take, shard_samples)
        if shard_size is not None:
            window = min(take, max(budget, 0) // _MIN_SAMPLE_BYTES + 1)
            written = cumulative[start + 1:start + 1 + window] - cumulative[start]
            needs = written + index_reserve(written, np.arange(1, window + 1)) - _INDEX_FIXED
            take = min(take, int(np.searchsorted(needs, budget, side="right")))
        take = max(take, 1)
        takes.append(take)
        start += take
    return takes


def export_order(source: Any, *, shuffle_seed: int | None, keyed: bool = True) -> pa.Array:
    """The sample ids of ``source`` (a ``TableSource``) in export order, reading only ``sample_id``.

    ``keyed=False`` gives the order of exports made before the keyed hash (a numpy permutation of the sorted
    ids seeded with ``shuffle_seed``), so tier copies of those releases still get their lineage index."""
    chunks = [batch.column(KEY_COLUMN) for batch in source.scan([KEY_COLUMN], batch_rows=65_536) if batch.num_rows]
    ids = pa.chunked_array(chunks, pa.string()).combine_chunks() if chunks else pa.array([], pa.string())
    if shuffle_seed is None:
        return ids.take(pc.sort_indices(ids))
    if not keyed:
        ordered = ids.take(pc.sort_indices(ids))
        return ordered.take(pa.array(np.random.default_rng(shuffle_seed).permutation(len(ordered))))
    keyed_ids = pa.table({"h": order_hash(ids, shuffle_seed), "id": ids})
    return ids.take(pc.sort_indices(keyed_ids, sort_keys=[("h", "ascending"), ("id", "ascending")]))


# The plan of an export in this process, on local disk (``BucketPlan``): rows are routed by their key (order hash and
# id, or id) to key-range buckets, each bucket is sorted on its own, and shards are cut across the buckets in order,
# so the driver holds one bucket's records (``bucket_rows`` at most, ~120 bytes a row) and one small entry per shard,
# whatever the release's size.
BUCKET_ROWS = 1 << 18
SAMPLED_IDS = 32_768  # ids sampled in the first pass, for id-order bucket splitters


def _as_keys(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Ids as numpy bytes (``S``): compared as Arrow sorts strings (byte order; ids never hold a NUL). Ids of one
    length (content hashes) are the Arrow data buffer seen as ``S{length}``, without a Python object per id
    (65,536 ids: ~5 ms -> ~0.1 ms)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    binary = pc.cast(ids, pa.large_binary())
    count = len(binary)
    if count and not binary.null_count and binary.buffers()[2] is not None:
        offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)[binary.offset:binary.offset + count + 1]
        width = int(offsets[1] - offsets[0])
        if width and int(offsets[-1] - offsets[0]) == width * count and bool((np.diff(offsets) == width).all()):
            return np.frombuffer(binary.buffers()[2], dtype=f"S{width}", count=count, offset=int(offsets[0])).copy()
    return np.asarray(binary.to_numpy(zero_copy_only=False).astype(bytes))


class IdSample:
    """A uniform sample of ``size`` ids (bottom-k of a seeded random priority per row), for id-order splitters."""

    def __init__(self, size: int = SAMPLED_IDS) -> None:
        self.size = size
        self._rng = np.random.default_rng(0)
        self._keys = np.asarray([], dtype="S1")
        self._priority = np.zeros(0)

    def add(self, ids: pa.Array | pa.ChunkedArray) -> None:
        priority = self._rng.random(len(ids))
        if len(self._keys) >= self.size:  # only rows that beat the sample's largest priority can enter it
            wanted = np.flatnonzero(priority < self._priority.max())
            if not len(wanted):
                return
            ids, priority = ids.take(pa.array(wanted)), priority[wanted]
        keys = np.concatenate([self._keys, _as_keys(ids)]) if len(self._keys) else _as_keys(ids)
        priority = np.concatenate([self._priority, priority])
        if len(keys) > self.size:
            keep = np.argpartition(priority, self.size - 1)[:self.size]
            keys, priority = keys[keep], priority[keep]
        self._keys, self._priority = keys, priority

    def splitters(self, buckets: int) -> np.ndarray:
        """``buckets - 1`` ids (sorted) that cut the sample into equal parts."""
        ordered = np.sort(self._keys)
        if not len(ordered) or buckets < 2:
            return np.asarray([], dtype="S1")
        return ordered[(np.arange(1, buckets) * len(ordered)) // buckets]


@dataclass(frozen=True)
class KeyBuckets:
    """Key ranges in export order: bucket ``b`` holds the rows whose key is at or past splitter ``b - 1`` and
    before splitter ``b``. Seeded: the order hash's range cut evenly (equal hashes share a bucket, so ties are
    ordered by id inside it); id order: splitters sampled from the ids. Equal ids always share a bucket."""

    count: int
    splitters: np.ndarray  # uint64 (seeded) or bytes (id order), count - 1 of them

    @classmethod
    def by_hash(cls, count: int) -> KeyBuckets:
        return cls(count, np.asarray([(b << 64) // count for b in range(1, count)], dtype=np.uint64))

    @classmethod
    def by_sample(cls, count: int, sample: IdSample) -> KeyBuckets:
        return cls(count, sample.splitters(count))

    def of(self, ids: pa.Array | pa.ChunkedArray, hashes: np.ndarray | None) -> np.ndarray:
        """Each row's bucket (int64)."""
        if not len(self.splitters):
            return np.zeros(len(ids), dtype=np.int64)
        keys = hashes if hashes is not None else _as_keys(ids)
        return np.searchsorted(self.splitters, keys, side="right").astype(np.int64)


def bucket_count(rows: int, *, bytes_per_row: int, bucket_bytes: int, max_buckets: int,
                 bucket_rows: int | None) -> int:
    """Buckets for ``rows`` rows: about ``bucket_bytes`` of encoded rows each, more when a bucket would hold over
    ``bucket_rows`` rows (the records sorted at once), ``max_buckets`` at most (files open at once: past
    ``max_buckets * bucket_rows`` rows a bucket holds more)."""
    by_bytes = -(-rows * max(bytes_per_row, 1) // max(bucket_bytes, 1))
    by_rows = -(-rows // max(bucket_rows or BUCKET_ROWS, 1))
    return max(1, min(max(by_bytes, by_rows), max_buckets))


class BucketPlan:
    """A plan on local disk: per bucket its rows' records sorted in export order (``sample_id``, the order hash when
    seeded, the row's ``offset`` and ``size`` in its spill bucket and the data bytes of each member ``m0``..), an
    Arrow IPC file each, one after another in one file (``SORTED``; ``segments``: where each bucket's lies, -1 for an
    empty bucket), the shard spans, and per shard its member bytes and first key. Read back a shard (or a slice of
    ranks) at a time (``rows``), for the shards, their lineage and the content digest."""

    def __init__(self, directory: str, *, spans: tuple[ShardSpan, ...], shard_bytes: list[int],
                 first_ids: list[str], first_hashes: list[int] | None, bucket_starts: np.ndarray,
                 extensions: tuple[str, ...], segments: np.ndarray) -> None:
        self.directory = directory
        self.path = os.path.join(directory, SORTED)
        self.segments = segments  # buckets x (start, end) in ``path``
        self.spans = spans
        self.extensions = extensions
        self.bucket_starts = bucket_starts  # buckets + 1: the rank of each bucket's first row
        self._shard_bytes = shard_bytes
        self._first_ids = first_ids
        self._first_hashes = first_hashes
        self._loaded: tuple[int, pa.Table] | None = None

    @property
    def num_samples(self) -> int:
        return int(self.bucket_starts[-1])

    @property
    def buckets(self) -> int:
        return len(self.bucket_starts) - 1

    def _load(self, bucket: int) -> pa.Table:
        if self._loaded is None or self._loaded[0] != bucket:
            self._loaded = None  # the one bucket held is given back before the next is read
            # memory-mapped (the table's buffers keep the map): a bucket read again (the token export reads the plan
            # in several passes) costs page-cache mappings, not a copy
            self._loaded = (bucket, _read_segment(self.path, self.segments[bucket]))
        return self._loaded[1]

    def rows(self, start: int, count: int) -> list[tuple[int, pa.Table]]:
        """The records of ranks ``[start, start + count)``, in order: (bucket, its records in the range) each."""
        end, pieces = start + count, []
        bucket = int(np.searchsorted(self.bucket_starts, start, side="right")) - 1
        while 0 <= bucket < self.buckets and self.bucket_starts[bucket] < end:
            low, high = int(self.bucket_starts[bucket]), int(self.bucket_starts[bucket + 1])
            if high > max(low, start):
                first = max(low, start)
                pieces.append((bucket, self._load(bucket).slice(first - low, min(end, high) - first)))
            bucket += 1
        return pieces

    def shard_ids(self, index: int) -> pa.Array:
        span = self.spans[index]
        chunks = [c for _, rows in self.rows(span.start, span.samples) for c in rows.column(KEY_COLUMN).chunks]
        return pa.chunked_array(chunks, pa.string()).combine_chunks() if chunks else pa.array([], pa.string())

    def shard_member_bytes(self, index: int) -> int:
        return self._shard_bytes[index]

    def id_chunks(self) -> Iterator[pa.Array]:
        for _, records in self.records():
            yield from records.column(KEY_COLUMN).chunks

    def records(self) -> Iterator[tuple[int, pa.Table]]:
        """Every bucket's sorted records with the rank of its first, in export order (one bucket held at a time)."""
        for bucket in range(self.buckets):
            if self.bucket_starts[bucket + 1] > self.bucket_starts[bucket]:
                yield int(self.bucket_starts[bucket]), self._load(bucket)
        self._loaded = None

    def router(self) -> ShardRouter:
        first_ids = np.asarray(self._first_ids, dtype=object).astype(bytes) if self._first_ids else \
            np.asarray([], dtype="S1")
        hashes = np.asarray(self._first_hashes, dtype=np.uint64) if self._first_hashes is not None else None
        return ShardRouter(first_ids, hashes, tuple(s.samples for s in self.spans))


class ShardCuts(Protocol):
    """A rule that cuts shards from samples fed in export order a piece (a bucket) at a time, holding only what the
    rule needs of the samples not yet in a shard (never their records)."""

    def feed(self, sizes: np.ndarray, final: bool) -> list[tuple[int, int]]:
        """The sizes of the samples after those fed before (``final``: the last of them); returns every shard closed
        as (samples, their sizes' sum), in order; the first counts the samples fed before and not yet in a shard.
        The shards are those the rule cuts from all the sizes at once."""
        ...


class SizeCuts:
    """The text export's rule (``cut_takes``): it holds the sizes of the samples not yet in a shard (8 bytes each;
    fewer than ``cut_lookahead`` of them after each piece)."""

    def __init__(self, *, shard_size: int | None, shard_samples: int | None) -> None:
        self.shard_size = shard_size
        self.shard_samples = shard_samples
        self._pending = np.zeros(0, dtype=np.int64)

    def feed(self, sizes: np.ndarray, final: bool) -> list[tuple[int, int]]:
        pending = np.concatenate([self._pending, np.asarray(sizes, dtype=np.int64)])
        cuts, position = [], 0
        for take in cut_takes(pending, shard_size=self.shard_size, shard_samples=self.shard_samples, final=final):
            cuts.append((take, int(pending[position:position + take].sum())))
            position += take
        self._pending = pending[position:].copy()  # not a view that keeps the piece's sizes
        return cuts


# a plan's sorted buckets, one Arrow IPC file each, back to back in one file (not a file per bucket: a create in a
# scratch folder of a busy ext4 costs ~0.3-1 ms, its recently deleted inodes skipped one by one), each starting at a
# multiple of _SEGMENT_ALIGN bytes so the memory-mapped buffers are aligned as Arrow wants them
SORTED = "sorted.arrow"
_SEGMENT_ALIGN = 64


def _read_segment(path: str, segment: np.ndarray) -> pa.Table:
    """One bucket's sorted records (its Arrow IPC file ending at ``segment[1]`` in ``path``: the footer's blocks
    are offsets in ``path``), through a memory map."""
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source, footer_offset=int(segment[1])).read_all()


def _record_at(path: str, segment: np.ndarray, row: int) -> tuple[str, int | None]:
    """The id (and order hash, when seeded) of one row of a bucket's sorted records, read through a memory map."""
    record = _read_segment(path, segment).slice(row, 1)
    key = record.column(KEY_COLUMN)[0].as_py()
    hashed = record.column("order_hash")[0].as_py() if "order_hash" in record.column_names else None
    del record
    return key, hashed


def sort_buckets(read: Callable[[int], pa.Table | None], buckets: int, *, directory: str, seeded: bool,
                 extensions: tuple[str, ...], shard_size: int | None, shard_samples: int | None,
                 where: str, cuts: ShardCuts | None = None) -> BucketPlan:
    """Sort each bucket's records (``read(bucket)``: in any order, or None when it has none) in export order into
    the plan's file (``SORTED``), refuse repeated ids (equal ids share a bucket), and cut shards across the buckets in order: a shard may
    span buckets; ``cuts`` (fed each bucket's sizes) holds what its rule needs of the samples not yet in a shard,
    ``SizeCuts`` by default; another rule, e.g. the token export's files. The driver holds one bucket's records
    and an entry per shard: a shard's first key in an earlier bucket is read back from that bucket's file."""
    rule: ShardCuts = cuts if cuts is not None else SizeCuts(shard_size=shard_size, shard_samples=shard_samples)
    keys = [("order_hash", "ascending"), (KEY_COLUMN, "ascending")] if seeded else [(KEY_COLUMN, "ascending")]
    spans: list[ShardSpan] = []
    shard_bytes: list[int] = []
    first_ids: list[str] = []
    first_hashes: list[int] | None = [] if seeded else None
    starts = np.zeros(buckets + 1, dtype=np.int64)
    path = os.path.join(directory, SORTED)
    segments = np.full((buckets, 2), -1, dtype=np.int64)
    sink = pa.OSFile(path, "wb")
    try:
        cut = total = repeats = 0  # cut: the rank of the first sample not yet in a shard
        for bucket in range(buckets):
            table = read(bucket)
            count = table.num_rows if table is not None else 0
            sizes = np.zeros(0, dtype=np.int64)
            if table is not None and count:
                table = table.take(pc.sort_indices(table, sort_keys=keys))
                repeats += _repeats(table.column(KEY_COLUMN))
                sink.write(b"\0" * (-sink.tell() % _SEGMENT_ALIGN))
                segments[bucket, 0] = sink.tell()
                with pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table)
                segments[bucket, 1] = sink.tell()
                sizes = np.asarray(table.column("size"), dtype=np.int64)
            total += count
            starts[bucket + 1] = total
            for samples, size_sum in rule.feed(sizes, bucket == buckets - 1):
                spans.append(ShardSpan(len(spans), cut, samples))
                shard_bytes.append(size_sum)
                if cut >= starts[bucket]:  # this bucket, in memory
                    assert table is not None
                    first_id = table.column(KEY_COLUMN)[cut - int(starts[bucket])].as_py()
                    first_hash = (int(table.column("order_hash")[cut - int(starts[bucket])].as_py()) if seeded
                                  else None)
                else:
                    # an empty bucket has no segment
                    held = int(np.searchsorted(starts[1:bucket + 1], cut, side="right"))
                    first_id, first_hash = _record_at(path, segments[held], cut - int(starts[held]))
                first_ids.append(first_id)
                if first_hashes is not None:
                    first_hashes.append(int(first_hash or 0))
                cut += samples
            del table, sizes
    finally:
        sink.close()
    if repeats:
        raise _not_unique(where, total, total - repeats)
    if cut != total:
        raise ValueError(f"{where}: the shard rule left {total - cut} of {total} samples out of every shard")
    return BucketPlan(directory, spans=tuple(spans), shard_bytes=shard_bytes, first_ids=first_ids,
                      first_hashes=first_hashes, bucket_starts=starts, extensions=extensions, segments=segments)


class SummaryPlan:
    """An engine export's plan on local disk, from the small summaries its tasks send back (``sample_id``, ``size``,
    ``order_hash`` (uint64) when seeded, and any other small columns the caller keeps per row, e.g. where a Ray run
    holds it), in any order: each summary is appended to a local file as it comes (counting the rows and, in id
    order, sampling ids for the buckets' splitters, which only the whole release gives), then routed to key buckets
    (``RecordSpill``) and sorted bucket by bucket (``sort_buckets``). The driver holds a summary, one bucket's
    records and an entry per shard: not the ~100 bytes per row of an in-memory plan (``plan_sizes``)."""

    def __init__(self, directory: str, *, shuffle_seed: int | None, where: str, bucket_rows: int | None = None,
                 max_buckets: int) -> None:
        self.directory = directory
        self.shuffle_seed = shuffle_seed
        self.where = where
        self.bucket_rows = bucket_rows
        self.max_buckets = max_buckets
        self.rows = 0
        self._path = os.path.join(directory, "summaries.arrow")
        self._sample = IdSample() if shuffle_seed is None else None
        self._sink: Any = None
        self._writer: Any = None

    def add(self, summary: pa.Table | pa.RecordBatch) -> None:
        """One task's summary (ids already checked by the task, ``checked_ids``)."""
        table = pa.Table.from_batches([summary]) if isinstance(summary, pa.RecordBatch) else summary
        if not table.num_rows:
            return
        if self.shuffle_seed is not None and "order_hash" not in table.column_names:
            table = table.append_column("order_hash", pa.array(order_hash(table.column(KEY_COLUMN), self.shuffle_seed),
                                                               pa.uint64()))
        if self._writer is None:
            self._sink = pa.OSFile(self._path, "wb")
            self._writer = pa.ipc.new_stream(self._sink, table.schema)
        self._writer.write_table(table, max_chunksize=65_536)
        self.rows += table.num_rows
        if self._sample is not None:
            self._sample.add(table.column(KEY_COLUMN))

    def plan(self, *, shard_size: int | None = None, shard_samples: int | None = None,
             cuts: ShardCuts | None = None) -> BucketPlan:
        """Route the summaries to key buckets, sort each and cut the shards (``sort_buckets``; the summaries' file is
        removed)."""
        count = max(1, min(-(-self.rows // max(self.bucket_rows or BUCKET_ROWS, 1)), self.max_buckets))
        buckets = KeyBuckets.by_hash(count) if self._sample is None else KeyBuckets.by_sample(count, self._sample)
        records = RecordSpill(self.directory)
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None
            with pa.OSFile(self._path) as handle:
                for batch in pa.ipc.open_stream(handle):
                    table = pa.Table.from_batches([batch])
                    hashes = (np.asarray(table.column("order_hash"), dtype=np.uint64)
                              if self.shuffle_seed is not None else None)
                    records.add(buckets.of(table.column(KEY_COLUMN), hashes), table)
            os.unlink(self._path)
        records.flush()
        return sort_buckets(records.read, count, directory=self.directory, seeded=self.shuffle_seed is not None,
                            extensions=(), shard_size=shard_size, shard_samples=shard_samples, where=self.where,
                            cuts=cuts)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None

"""The sampling plan: a global order per epoch, its split over ranks and workers, padding and resume.

Global order ``G`` (a permutation of the release's N samples) is a pure function of
(release_digest, seed, epoch): shards are permuted, their samples concatenated, then shuffled
within consecutive blocks of whole shards holding at least ``shuffle_buffer`` samples (so a reader
needs only the shards of one block at a time, the same idea as MosaicML Streaming's block shuffles,
and a cut between two blocks separates their shards).

Ranks: the remaining positions are cut into ``world_size`` contiguous, balanced spans; rank r reads
its span in order, so each rank reads only its own shards. Uneven counts follow ``uneven``:
``"pad"`` gives every rank ceil(m / W) samples by repeating the first remaining sample on the
short ranks (flagged ``is_padding``, fewer than W per epoch); ``"drop"`` gives floor(m / W) and
leaves the last m mod W positions of G unread this epoch.

Workers: a rank's stream is cut into one contiguous piece per DataLoader worker, at the points where
it enters a new block of whole shards (``worker_pieces``), so each worker reads only its own shards
and the remote bytes of an epoch are the release's whatever ``num_workers``. A worker yields its
piece's items (samples, or its own batches: with batches every rank yields
``ceil(n / batch_size) + num_workers - 1`` items, so ranks stay equal); DataLoader takes one item
from each worker in turn, so the rank's sequence is deterministic for a number of workers, and
``consumed_items`` tells from the trainer's count how far each piece was read.

Resume: a state is (epoch, the past segments [(world_size, samples consumed per rank, num_workers,
trainer items read by those workers after that)], and the same for the current one). Same world size
and workers: each worker continues its piece where the trainer's count says it stopped, the pieces
rotated so the DataLoader's interleaving continues exactly; another number of workers turns the
current segment into a past one (what remains is re-cut). Same world size: each rank continues its span at
the offset, O(1) in what was skipped. Different world size (elastic): the consumed prefixes of the
old spans are removed and what remains is re-cut over the new world size, so each remaining
sample is still read exactly once; the old world size becomes a past segment. With ``"drop"`` the
old cut's unread tail (its m mod W_old positions) is not lost: it stays in what remains and is
re-cut with the rest, so the epoch drops only the final cut's remainder (fewer than W_new samples),
and every sample is still read at most once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.random  # noqa: F401  numpy imports it lazily: loaded here, forked DataLoader workers inherit it (~0.1 s each)
import numpy.ma  # noqa: F401  likewise: np.unique (numpy 2.x) imports it on first call, ~17 ms in every worker

Uneven = Literal["pad", "drop"]
Intervals = list[tuple[int, int]]  # half-open ranges of positions in G


def resolve_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """rank/world_size given, else torch.distributed when initialized, else RANK/WORLD_SIZE env, else (0, 1)."""
    origin = "given"
    if rank is None or world_size is None:
        detected: tuple[int, int] | None = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                detected, origin = (dist.get_rank(), dist.get_world_size()), "torch.distributed"
        except ImportError:
            pass
        if detected is None:
            detected = (_env_int("RANK", 0), _env_int("WORLD_SIZE", 1))
            origin = "the RANK and WORLD_SIZE environment variables" + ("" if "WORLD_SIZE" in os.environ or
                                                                        "RANK" not in os.environ else " (WORLD_SIZE unset: 1)")
        rank = detected[0] if rank is None else rank
        world_size = detected[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size} (from {origin}); "
                         "pass rank= and world_size=, or set both variables")
    return rank, world_size


def require_state(dataset: object, state: object) -> None:
    """A ``load_state_dict`` argument that is not a state (None from an empty checkpoint, a checkpoint's path, the
    whole checkpoint dict the state is an entry of) is refused with what to pass, before a field of it is read."""
    name = type(dataset).__name__
    if not isinstance(state, Mapping):
        raise TypeError(f"{name}.load_state_dict takes the dict state_dict() returned (e.g. "
                        f"torch.load(path)[\"data\"]); got {type(state).__name__} {str(state)[:80]!r}")
    if "format" not in state:  # the README's checkpoint: {"data": dataset.state_dict(...), "model": ..., ...}
        inside = [key for key, value in state.items()
                  if isinstance(value, Mapping) and str(value.get("format", "")).startswith("datahub.loader")]
        if inside:
            keys = ", ".join(repr(key) for key in list(state)[:8]) + (", ..." if len(state) > 8 else "")
            raise ValueError(f"{name}.load_state_dict got a whole checkpoint (keys {keys}), not a state: pass "
                             f"checkpoint[{inside[0]!r}], the dict state_dict() returned")


def int_setting(field: str, value: Any, *, minimum: int | None = None) -> int:
    """A dataset's integer setting (a numpy integer or a numeric string too), else a ValueError naming ``field``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field} must be an integer; got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{field} must be >= {minimum}; got {value!r}")
    return number


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer (the loader reads RANK and "
                         "WORLD_SIZE when torch.distributed is not initialized)") from None


def _seed_words(digest: str, *extra: int) -> list[int]:
    """Entropy for numpy's SeedSequence: the release digest (hashed to 4 words) plus seed and epoch."""
    words = hashlib.sha256(digest.encode()).digest()[:16]
    return [int.from_bytes(words[i : i + 4], "little") for i in range(0, 16, 4)] + [int(x) for x in extra]


class EpochOrder:
    """``G`` for one epoch; ``lookup(positions)`` gives (shard index, sample index in shard) without building G."""

    def __init__(
        self,
        shard_sizes: Sequence[int],
        *,
        digest: str,
        seed: int,
        epoch: int,
        shuffle: bool = True,
        shuffle_buffer: int = 8192,
    ) -> None:
        sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.num_samples = int(sizes.sum())
        self._words = _seed_words(digest, seed, epoch)
        rng = np.random.default_rng(self._words + [0])
        self.shard_order = rng.permutation(len(sizes)) if shuffle else np.arange(len(sizes))
        self._starts = np.concatenate([[0], np.cumsum(sizes[self.shard_order])])
        buffer = int(shuffle_buffer) if shuffle and shuffle_buffer and shuffle_buffer > 1 else 0
        self.block = buffer
        # blocks are whole shards (consecutive in the permuted order) of >= shuffle_buffer samples, so a cut between
        # two blocks separates their shards: DataLoader workers cut there read disjoint shards
        self._block_bounds = _whole_shard_blocks(self._starts, buffer) if buffer else self._starts
        self._block_perms: dict[int, np.ndarray] = {}

    @property
    def shard_starts(self) -> np.ndarray:
        """Position in G where each slot of ``shard_order`` starts (and N at the end)."""
        return self._starts

    @property
    def boundaries(self) -> np.ndarray:
        """Positions in G where a new block (or, unshuffled, a new shard) starts: cutting there shares no shard."""
        return self._block_bounds

    def _block_perm(self, block: int) -> np.ndarray:
        perm = self._block_perms.get(block)
        if perm is None:
            length = int(self._block_bounds[block + 1] - self._block_bounds[block])
            perm = np.random.default_rng(self._words + [1, block]).permutation(length)
            if len(self._block_perms) > 4:
                self._block_perms.clear()
            self._block_perms[block] = perm
        return perm

    def concat_positions(self, positions: np.ndarray) -> np.ndarray:
        """G[i] as a position in the shard-permuted concatenation."""
        if not self.block:
            return positions
        out = np.empty_like(positions)
        blocks = np.searchsorted(self._block_bounds, positions, side="right") - 1
        # positions arrive in long runs of one block: handle each run with one fancy index
        change = np.flatnonzero(np.diff(blocks)) + 1
        for lo, hi in zip(np.concatenate([[0], change]), np.concatenate([change, [len(positions)]])):
            if lo == hi:
                continue
            block = int(blocks[lo])
            base = int(self._block_bounds[block])
            out[lo:hi] = base + self._block_perm(block)[positions[lo:hi] - base]
        return out

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        concat = self.concat_positions(np.asarray(positions, dtype=np.int64))
        slot = np.searchsorted(self._starts, concat, side="right") - 1
        return self.shard_order[slot], concat - self._starts[slot]


def _whole_shard_blocks(starts: np.ndarray, buffer: int) -> np.ndarray:
    """Block bounds: cut the shard starts greedily into runs of at least ``buffer`` samples (the last may be shorter)."""
    bounds = [0]
    for start in starts[1:-1].tolist():
        if start - bounds[-1] >= buffer:
            bounds.append(start)
    bounds.append(int(starts[-1]))
    return np.asarray(bounds, dtype=np.int64)


def slice_intervals(intervals: Intervals, start: int, stop: int) -> Intervals:
    """The sub-list [start, stop) of the concatenation of ``intervals``."""
    out: Intervals = []
    offset = 0
    for lo, hi in intervals:
        length = hi - lo
        a, b = max(start - offset, 0), min(stop - offset, length)
        if a < b:
            out.append((lo + a, lo + b))
        offset += length
        if offset >= stop:
            break
    return out


def _total(intervals: Intervals) -> int:
    return sum(hi - lo for lo, hi in intervals)


def rank_spans(intervals: Intervals, world_size: int, uneven: Uneven) -> list[tuple[Intervals, int]]:
    """Cut the remaining positions over ranks: per rank (its real positions, how many padding items)."""
    m = _total(intervals)
    q, rem = divmod(m, world_size)
    spans = []
    for rank in range(world_size):
        if uneven == "drop":
            spans.append((slice_intervals(intervals, rank * q, (rank + 1) * q), 0))
        else:
            start = rank * q + min(rank, rem)
            length = q + (1 if rank < rem else 0)
            spans.append((slice_intervals(intervals, start, start + length), 1 if rem and rank >= rem else 0))
    return spans


@dataclass(frozen=True, slots=True)
class RankStream:
    """One rank's samples for the rest of the epoch: real positions, then padding repeats of ``pad_position``."""

    intervals: Intervals
    padding: int
    pad_position: int

    def __len__(self) -> int:
        return _total(self.intervals) + self.padding

    def tail(self, start: int) -> RankStream:
        """The stream without its first ``start`` items."""
        real = _total(self.intervals)
        return RankStream(slice_intervals(self.intervals, start, real), max(0, self.padding - max(0, start - real)),
                          self.pad_position)

    def positions(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions in G of items [start, stop) and a bool mask of the padding ones."""
        real = _total(self.intervals)
        parts = [np.arange(lo, hi, dtype=np.int64) for lo, hi in slice_intervals(self.intervals, start, min(stop, real))]
        pads = max(0, min(stop, real + self.padding) - max(start, real))
        parts.append(np.full(pads, self.pad_position, dtype=np.int64))
        positions = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        mask = np.zeros(len(positions), dtype=bool)
        if pads:
            mask[-pads:] = True
        return positions, mask


Segment = tuple[int, int, int, int]  # (world_size, samples consumed per rank, num_workers, trainer items on the workers)


def _cut_candidates(stream: RankStream, boundaries: np.ndarray) -> np.ndarray:
    """Offsets in ``stream`` where it enters a new block of G (cutting there, both sides share no shard)."""
    found = [np.zeros(1, dtype=np.int64)]
    offset = 0
    for lo, hi in stream.intervals:
        inside = boundaries[np.searchsorted(boundaries, lo, side="right") : np.searchsorted(boundaries, hi, side="left")]
        found.append(offset + inside - lo)
        offset += hi - lo
    found.append(np.array([len(stream)], dtype=np.int64))
    return np.unique(np.concatenate(found))


def worker_pieces(stream: RankStream, num_workers: int, batch_size: int | None, boundaries: np.ndarray) -> list[np.ndarray]:
    """Cut a rank's stream into one contiguous piece per DataLoader worker; per piece, its item bounds (offsets in
    the stream: item k is [bounds[k], bounds[k + 1])).

    Cuts fall where the stream enters a new block of whole shards (``EpochOrder.boundaries``), so each worker reads
    only its own shards, unless that would unbalance the pieces by more than half a piece. With batches, every rank
    yields ``ceil(n / batch_size) + num_workers - 1`` items, the same on every rank whatever its cuts (a rank with
    fewer splits its last full batches in two): each worker's last batch may be short. A stream too short for that
    is cut at multiples of batch_size instead (``ceil(n / batch_size)`` items).
    """
    n, size = len(stream), batch_size or 1
    workers = max(1, num_workers)
    target = -(-n // size) + workers - 1 if size > 1 else n
    if workers == 1:
        cuts = [0, n]
    elif size > 1 and n < target:
        items = -(-n // size)
        cuts = [min(n, (items * k // workers) * size) for k in range(workers + 1)]
        target = items
    else:
        candidates = _cut_candidates(stream, boundaries)
        cuts, half = [0], n / workers / 2
        for k in range(1, workers):
            ideal = n * k / workers
            i = int(np.searchsorted(candidates, ideal))
            near = min(candidates[max(0, i - 1) : i + 1].tolist(), key=lambda c: abs(c - ideal))
            cuts.append(max(cuts[-1], near if abs(near - ideal) <= half else round(ideal)))
        cuts.append(n)
    pieces = [np.append(np.arange(a, b, size, dtype=np.int64), b) for a, b in zip(cuts, cuts[1:])]
    extra = target - sum(len(bounds) - 1 for bounds in pieces)
    for p, bounds in enumerate(pieces):  # split the last full batches in two until every rank has `target` items
        k = len(bounds) - 2
        while extra > 0 and k >= 0:
            if bounds[k + 1] - bounds[k] >= 2:
                bounds = np.insert(bounds, k + 1, (bounds[k] + bounds[k + 1]) // 2)
                extra -= 1
            k -= 1
        pieces[p] = bounds
    return pieces


def consumed_items(counts: Sequence[int], items: int) -> tuple[list[int], int]:
    """How many of its items each worker gave when a DataLoader yielded ``items`` in total, and the worker whose
    item comes next. DataLoader takes one item from each worker in turn, skipping workers that are done."""
    lengths = np.asarray(counts, dtype=np.int64)
    if not len(lengths):
        return [], 0
    items = min(int(items), int(lengths.sum()))
    lo, hi = 0, int(lengths.max())
    while lo < hi:  # the last full round R: sum(min(lengths, R)) <= items
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if int(np.minimum(lengths, mid).sum()) <= items else (lo, mid - 1)
    done = np.minimum(lengths, lo)
    extra = items - int(done.sum())
    active = np.flatnonzero(lengths > lo)
    done[active[:extra]] += 1
    if extra < len(active):
        following = int(active[extra])
    else:
        later = np.flatnonzero(lengths > lo + 1)
        following = int(later[0]) if len(later) else 0
    return done.tolist(), following


def _segment_rest(stream: RankStream, segment: Segment, batch_size: int | None, boundaries: np.ndarray) -> Intervals:
    """The real positions of one rank's stream that the segment left unread."""
    _, start, workers, items = segment
    if workers <= 1 or items <= 0:
        return slice_intervals(stream.intervals, start, _total(stream.intervals))
    tail = stream.tail(start)
    pieces = worker_pieces(tail, workers, batch_size, boundaries)
    done, _ = consumed_items([len(bounds) - 1 for bounds in pieces], items)
    rest: Intervals = []
    for bounds, count in zip(pieces, done):
        rest.extend(slice_intervals(tail.intervals, int(bounds[count]), int(bounds[-1])))
    return rest


def rank_stream(
    num_samples: int,
    *,
    segments: Sequence[Segment],
    world_size: int,
    rank: int,
    uneven: Uneven,
    batch_size: int | None = None,
    boundaries: np.ndarray | None = None,
) -> RankStream:
    """Replay the past segments (world size, samples consumed per rank, and what DataLoader workers consumed after
    that), then cut the rest for ``rank``."""
    cuts = boundaries if boundaries is not None else np.zeros(0, dtype=np.int64)
    remaining: Intervals = [(0, num_samples)] if num_samples else []
    for segment in segments:
        past_world = segment[0]
        left: Intervals = []
        pad_position = remaining[0][0] if remaining else 0
        for span, padding in rank_spans(remaining, past_world, uneven):
            left.extend(_segment_rest(RankStream(span, padding if remaining else 0, pad_position), segment,
                                      batch_size, cuts))
        if uneven == "drop":  # the tail that cut left unread is carried over, not lost (it lies after every span)
            left.extend(slice_intervals(remaining, past_world * (_total(remaining) // past_world), _total(remaining)))
        remaining = left
    span, padding = rank_spans(remaining, world_size, uneven)[rank]
    pad_position = remaining[0][0] if remaining else 0
    return RankStream(span, padding if remaining else 0, pad_position)


def stream_positions(stream: RankStream, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorized ``stream[offsets]``: positions in G and the padding mask (offsets must be < len(stream))."""
    lengths = np.array([hi - lo for lo, hi in stream.intervals], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)]) if len(lengths) else np.zeros(1, dtype=np.int64)
    real = int(starts[-1])
    padding = offsets >= real
    slot = np.clip(np.searchsorted(starts, offsets, side="right") - 1, 0, max(len(lengths) - 1, 0))
    lows = np.array([lo for lo, _ in stream.intervals] or [0], dtype=np.int64)
    positions = np.where(padding, stream.pad_position, lows[slot] + offsets - starts[slot])
    return positions, padding

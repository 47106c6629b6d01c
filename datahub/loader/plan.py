"""The sampling plan: a global order per epoch, its split over ranks and workers, padding and resume.

Global order ``G`` (a permutation of the release's N samples) is a pure function of
(release_digest, seed, epoch): shards are permuted, their samples concatenated, then shuffled
within consecutive blocks of ``shuffle_buffer`` samples (so a reader needs only the shards of one
block at a time; the same idea as MosaicML Streaming's block shuffles).

Ranks: the remaining positions are cut into ``world_size`` contiguous, balanced spans; rank r reads
its span in order, so each rank reads only its own shards. Uneven counts follow ``uneven``:
``"pad"`` gives every rank ceil(m / W) samples by repeating the first remaining sample on the
short ranks (flagged ``is_padding``, fewer than W per epoch); ``"drop"`` gives floor(m / W) and
leaves the last m mod W positions of G unread this epoch.

Workers: a rank's stream of items (samples, or batches when batch_size is set) is dealt
round-robin to its DataLoader workers, which is the order the DataLoader yields them back, so the
per-rank sequence does not depend on the number of workers.

Resume: a state is (epoch, the past segments [(world_size, samples consumed per rank)], and the
samples consumed per rank in the current one). Same world size: each rank continues its span at
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Uneven = Literal["pad", "drop"]
Intervals = list[tuple[int, int]]  # half-open ranges of positions in G


def resolve_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """rank/world_size given, else torch.distributed when initialized, else RANK/WORLD_SIZE env, else (0, 1)."""
    if rank is None or world_size is None:
        detected: tuple[int, int] | None = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                detected = (dist.get_rank(), dist.get_world_size())
        except ImportError:
            pass
        if detected is None:
            detected = (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
        rank = detected[0] if rank is None else rank
        world_size = detected[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")
    return rank, world_size


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
        self.block = int(shuffle_buffer) if shuffle and shuffle_buffer and shuffle_buffer > 1 else 0
        self._block_perms: dict[int, np.ndarray] = {}

    def _block_perm(self, block: int) -> np.ndarray:
        perm = self._block_perms.get(block)
        if perm is None:
            length = min(self.block, self.num_samples - block * self.block)
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
        blocks = positions // self.block
        # positions arrive in long runs of one block: handle each run with one fancy index
        change = np.flatnonzero(np.diff(blocks)) + 1
        for lo, hi in zip(np.concatenate([[0], change]), np.concatenate([change, [len(positions)]])):
            if lo == hi:
                continue
            block = int(blocks[lo])
            base = block * self.block
            out[lo:hi] = base + self._block_perm(block)[positions[lo:hi] - base]
        return out

    def lookup(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        concat = self.concat_positions(np.asarray(positions, dtype=np.int64))
        slot = np.searchsorted(self._starts, concat, side="right") - 1
        return self.shard_order[slot], concat - self._starts[slot]


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


def rank_stream(
    num_samples: int,
    *,
    segments: Sequence[tuple[int, int]],
    world_size: int,
    rank: int,
    uneven: Uneven,
) -> RankStream:
    """Replay the past segments (world size, samples consumed per rank), then cut the rest for ``rank``."""
    remaining: Intervals = [(0, num_samples)] if num_samples else []
    for past_world, consumed in segments:
        left: Intervals = []
        for span, _ in rank_spans(remaining, past_world, uneven):
            left.extend(slice_intervals(span, consumed, _total(span)))
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

"""Prefetch reads shards ahead of the consumer, and never holds more than ``prefetch_shards`` of them.

Observed through a real ShardSource subclass: it records which shards were read and when, and counts the
shard buffers still alive (a weakref finalizer per buffer), so "in memory" means what Python really holds.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datahub.loader.dataset import ReleaseDataset
from datahub.loader.shard_source import ShardBytes, ShardSource
from tests.loader.shards import all_ids, sample_id, write_release

SHARDS = 8


class TrackingSource(ShardSource):
    """A ShardSource that counts live shard buffers and signals each completed read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.live = 0
        self.peak = 0
        self.started: list[int] = []
        self.done = [threading.Event() for _ in self.manifest.shards]

    def read_buffer(self, shard_index: int) -> ShardBytes:
        with self._lock:
            self.started.append(shard_index)
            self.live += 1
            self.peak = max(self.peak, self.live)
        data = super().read_buffer(shard_index)  # a read-only mmap of the local replica
        weakref.finalize(data, self._freed)
        self.done[shard_index].set()
        return data

    def _freed(self) -> None:
        with self._lock:
            self.live -= 1


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_prefetch_reads_ahead_and_holds_at_most_depth_extra_shards(tmp_path: Path, depth: int) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(4,) * SHARDS, text_bytes=2000)
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle=False,
                             prefetch_shards=depth)
    source = dataset.source = TrackingSource(dataset.manifest)
    samples = iter(dataset)
    first = next(samples)  # the consumer is at shard 0 and stalls here
    assert first["sample_id"] == sample_id(0, 0)
    for ahead in range(1, depth + 1):
        assert source.done[ahead].wait(timeout=30), f"shard {ahead} was not read ahead with prefetch_shards={depth}"
    time.sleep(0.3)  # room for a read beyond the window to show up
    assert sorted(source.started) == list(range(depth + 1)), "read ahead exactly prefetch_shards shards, no more"
    assert source.live == depth + 1  # the shard in use plus the read-ahead ones
    rest = [first, *samples]
    assert [s["sample_id"] for s in rest] == all_ids(manifest)
    assert Counter(source.started) == Counter(range(SHARDS)), "each shard read once"
    assert source.peak <= depth + 1, f"{source.peak} shards in memory at once with prefetch_shards={depth}"
    del samples, rest, first
    assert source.live == 0, "every shard buffer is released after the epoch"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shuffled_epoch_stays_within_one_block_plus_read_ahead(tmp_path: Path, seed: int) -> None:
    write_release(tmp_path, samples_per_shard=(10,) * SHARDS)
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle_buffer=7,
                             prefetch_shards=2, seed=seed)
    source = dataset.source = TrackingSource(dataset.manifest)
    assert len(list(dataset)) == 10 * SHARDS
    # a block of 7 samples touches at most 2 shards of 10 (it can straddle a boundary), plus 2 read ahead
    assert source.peak <= 2 + 2 and Counter(source.started) == Counter(range(SHARDS))

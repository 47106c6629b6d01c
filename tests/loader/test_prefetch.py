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


@pytest.mark.parametrize("batch_format", ["list", "arrow"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_shard_shared_by_two_plan_chunks_is_read_once_and_leaves_no_future(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_format: str, depth: int) -> None:
    """The next plan chunk's shards are scheduled when a chunk starts; a shard both chunks use (one straddling the
    chunk boundary, or a shuffle block's shards) must not be queued a second time: that copy was read again after the
    first take and its future, never taken, held the bytes and a prefetch slot for the rest of the epoch."""
    import datahub.loader.dataset as dataset_module
    from datahub.loader.prefetch import Prefetcher

    monkeypatch.setattr(dataset_module, "_CHUNK_ITEMS", 5)  # many chunk boundaries inside shards and blocks
    never_taken: list[list[int]] = []
    close = Prefetcher.close

    def recording_close(self: Prefetcher) -> None:
        never_taken.append(sorted(self._futures))
        close(self)

    monkeypatch.setattr(Prefetcher, "close", recording_close)
    sizes = (7, 3, 12, 1, 9, 4, 11, 6)
    write_release(tmp_path, samples_per_shard=sizes, text_bytes=24)
    for shuffle, shuffle_buffer in [(False, 0), (True, 10), (True, 0)]:
        dataset = ReleaseDataset(str(tmp_path / "manifest.json"), shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                                 verify=False, prefetch_shards=depth, batch_format=batch_format,  # type: ignore[arg-type]
                                 batch_size=2 if batch_format == "arrow" else None)
        never_taken.clear()
        items = list(dataset)
        assert (sum(len(item) for item in items) if batch_format == "arrow" else len(items)) == sum(sizes)
        reads = Counter(name for (_, name) in dataset.source.reads.elements())
        assert reads == Counter(shard.name for shard in dataset.manifest.shards), \
            f"each shard read once (shuffle={shuffle}, buffer={shuffle_buffer})"
        assert never_taken == [[]], "every prefetched shard was taken"

"""Exactly-once over ranks x DataLoader workers, equal counts per rank, determinism, epochs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import ReleaseDataset  # noqa: E402
from tests.loader.shards import all_ids  # noqa: E402


def rank_ids(manifest_path: str, rank: int, world_size: int, workers: int, **kwargs: Any) -> list[tuple[str, bool]]:
    dataset = ReleaseDataset(manifest_path, rank=rank, world_size=world_size, shuffle_buffer=5, **kwargs)
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    out = []
    for item in loader:
        for sample in item if isinstance(item, list) else [item]:
            out.append((sample["sample_id"], bool(sample["is_padding"])))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_each_sample_exactly_once_with_padding(manifest_path: str, release: dict, world_size: int, workers: int) -> None:
    assert world_size == 1 or len(all_ids(release)) % world_size, "the fixture must not divide evenly by the ranks"
    per_rank = [rank_ids(manifest_path, rank, world_size, workers) for rank in range(world_size)]
    assert len({len(ids) for ids in per_rank}) == 1, "every rank must yield the same number of samples"
    real = Counter(sample for ids in per_rank for sample, padding in ids if not padding)
    assert sorted(real) == sorted(all_ids(release)) and set(real.values()) == {1}
    padding = sum(padding for ids in per_rank for _, padding in ids)
    assert padding == (-len(real)) % world_size


@pytest.mark.parametrize("world_size,workers", [(3, 2), (2, 1), (2, 2), (3, 0)])
def test_drop_policy_equal_counts_at_most_once(manifest_path: str, release: dict, world_size: int, workers: int) -> None:
    assert len(all_ids(release)) % world_size, "the fixture must leave a remainder to drop"
    per_rank = [rank_ids(manifest_path, rank, world_size, workers, uneven="drop") for rank in range(world_size)]
    counts = {len(ids) for ids in per_rank}
    assert counts == {len(all_ids(release)) // world_size}
    seen = Counter(sample for ids in per_rank for sample, padding in ids)
    assert set(seen.values()) == {1} and not any(p for ids in per_rank for _, p in ids)


def test_batches_equal_per_rank_and_exactly_once(manifest_path: str, release: dict) -> None:
    per_rank = []
    for rank in range(3):
        dataset = ReleaseDataset(manifest_path, rank=rank, world_size=3, batch_size=4)
        batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(batches) == len(dataset)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1
    real = Counter(s["sample_id"] for batches in per_rank for batch in batches for s in batch if not s["is_padding"])
    assert sorted(real) == sorted(all_ids(release)) and set(real.values()) == {1}


def test_order_is_deterministic_for_a_number_of_workers(manifest_path: str) -> None:
    """One worker reads the rank's stream in order; several read one piece each (their own shards), interleaved."""
    reference = rank_ids(manifest_path, 1, 2, 0)
    assert rank_ids(manifest_path, 1, 2, 1) == reference
    two = rank_ids(manifest_path, 1, 2, 2)
    assert rank_ids(manifest_path, 1, 2, 2) == two
    assert sorted(two) == sorted(reference)


def test_epochs_and_seeds_differ(manifest_path: str) -> None:
    epoch0 = rank_ids(manifest_path, 0, 1, 0)
    epoch1 = rank_ids(manifest_path, 0, 1, 0, epoch=1)
    seed1 = rank_ids(manifest_path, 0, 1, 0, seed=1)
    assert sorted(epoch0) == sorted(epoch1) == sorted(seed1)
    assert epoch0 != epoch1 and epoch0 != seed1
    dataset = ReleaseDataset(manifest_path, rank=0, world_size=1, shuffle_buffer=5)
    dataset.set_epoch(1)
    assert [(s["sample_id"], s["is_padding"]) for s in dataset] == epoch1


def test_no_shuffle_is_release_order(manifest_path: str, release: dict) -> None:
    dataset = ReleaseDataset(manifest_path, rank=0, world_size=1, shuffle=False, decode="json")
    samples = list(dataset)
    assert [s["sample_id"] for s in samples] == all_ids(release)
    assert samples[0]["meta"]["sample_id"] == samples[0]["sample_id"] and samples[0]["text"].startswith("sample")


def test_rank_and_world_size_from_env(manifest_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = ReleaseDataset(manifest_path)
    assert (dataset.rank, dataset.world_size) == (2, 3)
    with pytest.raises(ValueError, match="rank must be in"):
        ReleaseDataset(manifest_path, rank=3, world_size=3)


def test_a_rank_without_world_size_in_the_environment_says_where_they_came_from(
        manifest_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"got rank=1, world_size=1 \(from the RANK and WORLD_SIZE environment "
                                         r"variables \(WORLD_SIZE unset: 1\)\); pass rank= and world_size="):
        ReleaseDataset(manifest_path)
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match=r"environment variable RANK='one' is not an integer"):
        ReleaseDataset(manifest_path)


def test_is_a_torch_iterable_dataset(manifest_path: str) -> None:
    assert isinstance(ReleaseDataset(manifest_path, rank=0, world_size=1), torch.utils.data.IterableDataset)

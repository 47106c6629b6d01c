"""DataLoader workers read disjoint shards: exactly-once over ranks x workers, exact resume, elastic resume."""

from __future__ import annotations

import itertools
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import ReleaseDataset  # noqa: E402
from tests.loader.shards import all_ids, write_release  # noqa: E402

SHARDS = (10, 9, 11, 10, 8, 12, 10, 9, 11, 10, 7, 13)  # 120 samples: uneven over 7 ranks, shards of unequal size


@pytest.fixture
def wide(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    manifest = write_release(tmp_path / "export", samples_per_shard=SHARDS)
    return str(tmp_path / "export" / "manifest.json"), manifest


def with_pid(raw: dict[str, Any]) -> dict[str, Any]:
    return {"sample_id": raw["sample_id"], "is_padding": raw["is_padding"], "pid": os.getpid()}


def make(path: str, rank: int, world: int, **kwargs: Any) -> ReleaseDataset:
    settings: dict[str, Any] = {"seed": 5, "epoch": 1, "shuffle_buffer": 10, "decode": with_pid, **kwargs}
    return ReleaseDataset(path, rank=rank, world_size=world, **settings)


def samples(items: Any) -> list[dict[str, Any]]:
    return [s for item in items for s in (item if isinstance(item, list) else [item])]


@pytest.mark.parametrize("world,workers", [(1, 4), (3, 2)])
def test_each_worker_reads_its_own_shards_and_each_sample_once(wide: tuple[str, dict], world: int, workers: int) -> None:
    path, manifest = wide
    real: Counter[str] = Counter()
    lengths = set()
    for rank in range(world):
        dataset = make(path, rank, world)
        out = samples(DataLoader(dataset, batch_size=None, num_workers=workers))
        lengths.add(len(out))
        readers: defaultdict[str, set[int]] = defaultdict(set)  # shard -> worker processes that yielded from it
        for sample in out:
            readers[sample["sample_id"][:4]].add(sample["pid"])
        assert len({pid for pids in readers.values() for pid in pids}) == workers, "every worker had work"
        assert all(len(pids) == 1 for pids in readers.values()), f"a shard read by two workers: {dict(readers)}"
        real.update(s["sample_id"] for s in out if not s["is_padding"])
    assert len(lengths) == 1, "every rank yields the same number of samples"
    assert sorted(real) == sorted(all_ids(manifest)) and set(real.values()) == {1}


def test_batches_with_workers_are_equal_per_rank_and_exactly_once(wide: tuple[str, dict]) -> None:
    path, manifest = wide
    per_rank = []
    for rank in range(3):
        dataset = make(path, rank, 3, batch_size=4)
        batches = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert len(batches) == len(dataset) == -(-40 // 4) + 1  # each worker's last batch may be short
        per_rank.append(batches)
    real = Counter(s["sample_id"] for batches in per_rank for s in samples(batches) if not s["is_padding"])
    assert sorted(real) == sorted(all_ids(manifest)) and set(real.values()) == {1}


@pytest.mark.parametrize("batch_size", [None, 4])
def test_kill_after_40_percent_and_resume_exact(wide: tuple[str, dict], batch_size: int | None) -> None:
    """3 ranks x 2 workers; each rank's trainer stops after 40% of its items and resumes from state_dict(consumed)."""
    path, manifest = wide
    seen: list[str] = []
    for rank in range(3):
        full = [s["sample_id"] for s in samples(DataLoader(make(path, rank, 3, batch_size=batch_size),
                                                           batch_size=None, num_workers=2))]
        dataset = make(path, rank, 3, batch_size=batch_size)
        iterator = iter(DataLoader(dataset, batch_size=None, num_workers=2))
        steps = int(0.4 * len(dataset))
        head = list(itertools.islice(iterator, steps))
        state = dataset.state_dict(consumed=steps)
        del iterator  # the job dies; its workers with it
        resumed = make(path, rank, 3, batch_size=batch_size)
        resumed.load_state_dict(state)
        rest = samples(DataLoader(resumed, batch_size=None, num_workers=2))
        assert [s["sample_id"] for s in samples(head) + rest] == full, "the resumed run continues the same sequence"
        seen += [s["sample_id"] for s in samples(head) + rest if not s["is_padding"]]
    assert sorted(seen) == sorted(all_ids(manifest))


@pytest.mark.parametrize("new_world,new_workers", [(2, 2), (2, 3), (2, 0)])
def test_resume_three_ranks_two_workers_on_fewer_ranks_exactly_once(
    wide: tuple[str, dict], new_world: int, new_workers: int
) -> None:
    path, manifest = wide
    seen: list[str] = []
    state: dict[str, Any] = {}
    for rank in range(3):
        dataset = make(path, rank, 3)
        iterator = iter(DataLoader(dataset, batch_size=None, num_workers=2))
        seen += [s["sample_id"] for s in itertools.islice(iterator, 17) if not s["is_padding"]]
        state = dataset.state_dict(consumed=17)
        del iterator
    lengths = set()
    for rank in range(new_world):
        dataset = make(path, rank, new_world)
        dataset.load_state_dict(state)
        out = samples(DataLoader(dataset, batch_size=None, num_workers=new_workers))
        lengths.add(len(out))
        seen += [s["sample_id"] for s in out if not s["is_padding"]]
    assert len(lengths) == 1
    tally = Counter(seen)
    assert sorted(tally) == sorted(all_ids(manifest)) and set(tally.values()) == {1}


def test_resume_with_another_number_of_workers_exactly_once(wide: tuple[str, dict]) -> None:
    path, manifest = wide
    dataset = make(path, 0, 1, batch_size=3)
    iterator = iter(DataLoader(dataset, batch_size=None, num_workers=4))
    head = samples(itertools.islice(iterator, 9))
    state = dataset.state_dict(consumed=9)
    del iterator
    resumed = make(path, 0, 1, batch_size=3)
    resumed.load_state_dict(state)
    rest = samples(DataLoader(resumed, batch_size=None, num_workers=2))
    tally = Counter(s["sample_id"] for s in head + rest)
    assert sorted(tally) == sorted(all_ids(manifest)) and set(tally.values()) == {1}


def test_arrow_batches_hold_the_list_batches_samples(wide: tuple[str, dict]) -> None:
    pa = pytest.importorskip("pyarrow")
    path, _ = wide
    settings: dict[str, Any] = {"seed": 5, "shuffle_buffer": 10, "batch_size": 8}
    lists = list(DataLoader(ReleaseDataset(path, rank=1, world_size=2, **settings), batch_size=None, num_workers=2))
    tables = list(DataLoader(ReleaseDataset(path, rank=1, world_size=2, batch_format="arrow", **settings),
                             batch_size=None, num_workers=2))
    assert all(isinstance(batch, pa.RecordBatch) for batch in tables)
    assert [batch.to_pylist() for batch in tables] == lists


def test_arrow_batches_need_a_batch_size_and_text(wide: tuple[str, dict]) -> None:
    path, _ = wide
    with pytest.raises(ValueError, match="batch_format='arrow'.*batch_size=N"):
        ReleaseDataset(path, rank=0, world_size=1, batch_format="arrow")
    with pytest.raises(ValueError, match="decode='text'"):
        ReleaseDataset(path, rank=0, world_size=1, batch_format="arrow", batch_size=4, decode="json")

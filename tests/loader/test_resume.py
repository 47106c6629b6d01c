"""Mid-epoch resume: plain per-rank state, StatefulDataLoader, elastic world size, and O(1) skipping."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import ReleaseDataset  # noqa: E402
from tests.loader.shards import all_ids, write_release  # noqa: E402


def make(manifest_path: str, rank: int = 0, world_size: int = 1, **kwargs: Any) -> ReleaseDataset:
    settings: dict[str, Any] = {"seed": 3, "epoch": 2, "shuffle_buffer": 6, **kwargs}
    return ReleaseDataset(manifest_path, rank=rank, world_size=world_size, **settings)


def ids(samples: Any) -> list[str]:
    return [s["sample_id"] for s in samples]


def test_resume_in_process_yields_exactly_the_rest(manifest_path: str) -> None:
    full = ids(make(manifest_path))
    dataset = make(manifest_path)
    head = ids(itertools.islice(iter(dataset), 11))
    state = dataset.state_dict()
    assert state["consumed"] == 11
    resumed = make(manifest_path, epoch=0)
    resumed.load_state_dict(state)
    assert resumed.epoch == 2 and len(resumed) == len(full) - 11
    assert head + ids(resumed) == full


def test_resume_from_trainer_count_with_plain_dataloader_workers(manifest_path: str) -> None:
    dataset = make(manifest_path, rank=1, world_size=2, batch_size=3)
    full = list(DataLoader(dataset, batch_size=None, num_workers=2))
    state = dataset.state_dict(consumed=2)  # the trainer received 2 batches
    resumed = make(manifest_path, rank=1, world_size=2, batch_size=3)
    resumed.load_state_dict(state)
    rest = list(DataLoader(resumed, batch_size=None, num_workers=2))
    assert [ids(b) for b in full[2:]] == [ids(b) for b in rest]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_stateful_dataloader(manifest_path: str, workers: int) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(make(manifest_path), batch_size=None, num_workers=workers)
    full = ids(stateful.StatefulDataLoader(make(manifest_path), batch_size=None, num_workers=workers))
    iterator = iter(loader)
    head = ids(next(iterator) for _ in range(9))
    state = loader.state_dict()
    del iterator
    fresh = stateful.StatefulDataLoader(make(manifest_path), batch_size=None, num_workers=workers)
    fresh.load_state_dict(state)
    assert head + ids(fresh) == full


@pytest.mark.parametrize("old_world,new_world,steps", [(2, 3, 4), (3, 1, 5), (3, 2, 8), (1, 2, 0)])
def test_elastic_resume_reads_each_remaining_sample_once(
    manifest_path: str, release: dict, old_world: int, new_world: int, steps: int
) -> None:
    seen: list[str] = []
    states = []
    for rank in range(old_world):  # synchronous training: every rank consumed `steps` samples
        dataset = make(manifest_path, rank, old_world)
        seen += [s["sample_id"] for s in itertools.islice(iter(dataset), steps) if not s["is_padding"]]
        states.append(dataset.state_dict())
    assert all(state == states[0] for state in states), "ranks save identical states"
    counts = set()
    for rank in range(new_world):
        dataset = make(manifest_path, rank, new_world)
        dataset.load_state_dict(states[0])
        samples = list(dataset)
        counts.add(len(samples))
        seen += [s["sample_id"] for s in samples if not s["is_padding"]]
    assert len(counts) == 1
    tally = Counter(seen)
    assert sorted(tally) == sorted(all_ids(release)) and set(tally.values()) == {1}


@pytest.mark.parametrize("old_world,new_world,steps", [(2, 3, 4), (3, 2, 5), (3, 1, 9), (2, 1, 7), (2, 3, 14)])
def test_elastic_resume_in_drop_mode_keeps_the_old_tail_and_drops_only_the_new_remainder(
    manifest_path: str, release: dict, old_world: int, new_world: int, steps: int
) -> None:
    total = len(all_ids(release))
    assert total % old_world, "the old cut must leave a tail for this test to mean anything"
    seen: list[str] = []
    state: dict[str, Any] = {}
    for rank in range(old_world):
        dataset = make(manifest_path, rank, old_world, uneven="drop")
        seen += ids(itertools.islice(iter(dataset), steps))
        state = dataset.state_dict()
    left = total - old_world * steps  # includes the old cut's unread tail of total % old_world samples
    counts = set()
    for rank in range(new_world):
        dataset = make(manifest_path, rank, new_world, uneven="drop")
        dataset.load_state_dict(state)
        assert len(dataset) == left // new_world
        samples = list(dataset)
        counts.add(len(samples))
        assert not any(s["is_padding"] for s in samples)
        seen += ids(samples)
    assert counts == {left // new_world}, "equal counts per rank, so DDP does not hang"
    tally = Counter(seen)
    assert set(tally.values()) == {1}, "each sample at most once"
    assert len(tally) == total - left % new_world, "only the new cut's remainder is dropped"


def test_old_drop_mode_elastic_state_is_refused(manifest_path: str) -> None:
    dataset = make(manifest_path, 0, 2, uneven="drop")
    state = {**dataset.state_dict(), "format": "datahub.loader/1", "segments": [[3, 2]]}
    with pytest.raises(ValueError, match="unread tail"):
        make(manifest_path, 0, 2, uneven="drop").load_state_dict(state)
    with pytest.raises(ValueError, match="blocks of whole shards"):  # shuffled before /3: another order
        make(manifest_path, 0, 2, uneven="drop").load_state_dict({**state, "segments": []})
    plain = make(manifest_path, 0, 2, uneven="drop", shuffle=False)
    old = {**plain.state_dict(), "format": "datahub.loader/2", "segments": [[3, 2]], "consumed": 1}
    plain.load_state_dict(old)  # unshuffled: the same order in /2 and /3
    assert plain._segments == [(3, 2, 1, 0)] and len(plain) == (29 - 6) // 2 - 1


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_two_elastic_resumes_chain(manifest_path: str, release: dict, uneven: str) -> None:
    seen: list[str] = []
    state = None
    left = len(all_ids(release))
    for world, steps in [(2, 3), (3, 2), (2, None)]:
        next_state = None
        for rank in range(world):
            dataset = make(manifest_path, rank, world, uneven=uneven)
            if state is not None:
                dataset.load_state_dict(state)
            samples = list(itertools.islice(iter(dataset), steps)) if steps is not None else list(dataset)
            seen += [s["sample_id"] for s in samples if not s["is_padding"]]
            next_state = dataset.state_dict()
        state = next_state
        left -= world * steps if steps is not None else 0
    tally = Counter(seen)
    assert set(tally.values()) == {1}
    if uneven == "pad":
        assert sorted(tally) == sorted(all_ids(release))
    else:  # the last cut (2 ranks) drops its remainder only
        assert len(tally) == len(all_ids(release)) - left % 2


def test_resume_does_not_read_skipped_shards(tmp_path: Path) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(10,) * 10)
    path = str(tmp_path / "manifest.json")
    order = ReleaseDataset(path, rank=0, world_size=1, shuffle_buffer=10, seed=1)
    full = list(order)
    resume_at = 73
    dataset = ReleaseDataset(path, rank=0, world_size=1, shuffle_buffer=10, seed=1, prefetch_shards=0)
    dataset.load_state_dict({**order.state_dict(), "consumed": resume_at})
    rest = list(dataset)
    assert ids(rest) == ids(full[resume_at:])
    needed = {sample_id[:4] for sample_id in ids(full[resume_at:])}
    opened = {name for (_, name) in dataset.source.reads}
    assert len(opened) == len(needed) < len(manifest["shards"]) / 2
    assert all(dataset.source.reads[key] == 1 for key in dataset.source.reads)


def test_state_from_other_settings_is_refused(manifest_path: str) -> None:
    state = make(manifest_path).state_dict()
    other = ReleaseDataset(manifest_path, rank=0, world_size=1, seed=4, shuffle_buffer=6)
    with pytest.raises(ValueError, match="seed: checkpoint 3, dataset 4"):
        other.load_state_dict(state)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_state_dict_without_consumed_is_refused_when_workers_read(manifest_path: str, batch_size: int | None) -> None:
    """A plain DataLoader with workers: this process yielded nothing, so it must not record consumed=0."""
    from datahub.loader.errors import ConsumedCountRequiredError

    full = list(DataLoader(make(manifest_path, batch_size=batch_size), batch_size=None, num_workers=2))
    dataset = make(manifest_path, batch_size=batch_size)
    iterator = iter(DataLoader(dataset, batch_size=None, num_workers=2))
    head = [next(iterator) for _ in range(4)]
    unit = "batches" if batch_size else "samples"
    with pytest.raises(ConsumedCountRequiredError, match=rf"state_dict\(consumed=N\), N = the {unit} the DataLoader"):
        dataset.state_dict()
    state = dataset.state_dict(consumed=len(head))
    del iterator
    resumed = make(manifest_path, batch_size=batch_size)
    resumed.load_state_dict(state)
    rest = list(DataLoader(resumed, batch_size=None, num_workers=2))
    flat = (lambda items: [s["sample_id"] for item in items for s in (item if batch_size else [item])])
    assert flat(head) + flat(rest) == flat(full)
    # iterated in this process again, the count is the trainer's: no refusal
    in_process = iter(dataset)
    next(in_process)
    assert dataset.state_dict()["consumed"] == (batch_size or 1)


def test_a_refused_load_state_dict_leaves_the_position_as_it_was(manifest_path: str) -> None:
    # a StatefulDataLoader worker state cannot move to another world size; the refusal used to come after the
    # epoch, segments and worker position were already replaced, so a trainer that caught it read another position
    source = make(manifest_path, rank=0, world_size=2, batch_size=2)
    state = source.state_dict(consumed=3)
    state["epoch"] = 5
    state["worker"] = {"worker_id": 0, "num_workers": 2, "items": 1}
    dataset = make(manifest_path, rank=0, world_size=3, batch_size=2)
    want = [ids(batch) for batch in make(manifest_path, rank=0, world_size=3, batch_size=2)]
    with pytest.raises(ValueError, match="different world size"):
        dataset.load_state_dict(state)
    assert [ids(batch) for batch in dataset] == want

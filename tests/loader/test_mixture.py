"""MixtureDataset: weights held, each source exactly once over ranks x workers, resume with new weights and ranks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader import ReleaseDataset  # noqa: E402
from datahub.loader.mixture import MixtureDataset, merge_next  # noqa: E402
from datahub.loader.packing import PackedDataset  # noqa: E402
from tests.loader.shards import all_ids, write_release  # noqa: E402
from tests.loader.tokens import real_tokens, write_tokens  # noqa: E402

SHARDS_A, SHARDS_B, SHARDS_C = (7, 6, 5, 7, 4), (10, 10, 10, 9), (6, 5)


@pytest.fixture
def text(tmp_path: Path) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name, shards in (("a", SHARDS_A), ("b", SHARDS_B), ("c", SHARDS_C)):
        manifest = write_release(tmp_path / name, release=f"{name}-v1", samples_per_shard=shards)
        out[name] = (str(tmp_path / name / "manifest.json"), all_ids(manifest))
    return out


def mixture(text: dict[str, tuple[str, list[str]]], weights: dict[str, float], rank: int, world: int,
            **kwargs: Any) -> MixtureDataset:
    sources = {name: ReleaseDataset(path, seed=2, shuffle_buffer=8) for name, (path, _) in text.items()}
    return MixtureDataset(sources, weights, rank=rank, world_size=world, epoch=1, **kwargs)


def keys(items: Any) -> list[tuple[str, str]]:
    return [(s["source"], s["sample_id"]) for batch in items for s in batch if not s["is_padding"]]


def expected(text: dict[str, tuple[str, list[str]]]) -> list[tuple[str, str]]:
    return sorted((name, sample) for name, (_, ids) in text.items() for sample in ids)


def test_merge_holds_the_weights_and_does_not_depend_on_chunks() -> None:
    weights, remaining = np.array([0.5, 0.3, 0.2]), np.array([1000, 1000, 1000])
    sources, _ = merge_next(weights, remaining, np.zeros(3, np.int64), 1000)
    for prefix in (10, 97, 500, 1000):  # every prefix holds each share to within one item
        counts = np.bincount(sources[:prefix], minlength=3)
        assert np.all(np.abs(counts - weights * prefix) <= 1), (prefix, counts)
    done, parts = np.zeros(3, np.int64), []
    for size in (1, 7, 64, 300, 628):
        part, _ = merge_next(weights, remaining, done, size)
        np.add.at(done, part, 1)
        parts.append(part)
    assert np.array_equal(np.concatenate(parts), sources)


def test_each_source_once_over_3_ranks_x_2_workers(text: dict[str, tuple[str, list[str]]]) -> None:
    seen: Counter[tuple[str, str]] = Counter()
    lengths = set()
    for rank in range(3):
        batches = list(DataLoader(mixture(text, {"a": 0.5, "b": 0.3, "c": 0.2}, rank, 3, batch_size=4),
                                  batch_size=None, num_workers=2))
        seen.update(keys(batches))
        lengths.add(len(batches))
    assert len(lengths) == 1, "every rank yields the same number of batches"
    assert sorted(seen) == expected(text) and set(seen.values()) == {1}


def test_weights_changed_at_resume_continue_each_cursor(text: dict[str, tuple[str, list[str]]]) -> None:
    seen: Counter[tuple[str, str]] = Counter()
    states = []
    for rank in range(3):
        dataset = mixture(text, {"a": 0.6, "b": 0.2, "c": 0.2}, rank, 3, batch_size=2)
        loader = iter(DataLoader(dataset, batch_size=None, num_workers=2))
        seen.update(keys(next(loader) for _ in range(3)))
        states.append(dataset.state_dict(consumed=3))
    assert all(state == states[0] for state in states)
    cursors = {name: source["cursor"] for name, source in states[0]["sources"].items()}
    assert sum(cursors.values()) == 3 * 2 * 3 and cursors["a"] > cursors["b"]
    after: list[tuple[str, str]] = []
    for rank in range(2):  # new weights, another world size
        dataset = mixture(text, {"a": 0.1, "b": 0.9, "c": 0.02}, rank, 2, batch_size=3)
        dataset.load_state_dict(json.loads(json.dumps(states[0])))
        after.extend(keys(DataLoader(dataset, batch_size=None, num_workers=1)))
    seen.update(after)
    assert sorted(seen) == expected(text) and set(seen.values()) == {1}, "no sample repeated or skipped"
    # the new weights apply from the cursors: b dominates until it runs out
    assert Counter(name for name, _ in after[:10])["b"] >= 8
    state = dataset.state_dict(consumed=0)
    assert state["weights"]["b"] == pytest.approx(0.9 / 1.02)  # normalized
    assert all(source["start"] == cursors[name] for name, source in state["sources"].items())


def test_resume_with_the_same_weights_continues_the_merge(text: dict[str, tuple[str, list[str]]]) -> None:
    whole = keys(mixture(text, {"a": 0.5, "b": 0.5, "c": 1.0}, 0, 1, batch_size=5))
    dataset = mixture(text, {"a": 0.5, "b": 0.5, "c": 1.0}, 0, 1, batch_size=5)
    iterator = iter(dataset)
    first = keys(next(iterator) for _ in range(4))
    resumed = mixture(text, {"a": 0.5, "b": 0.5, "c": 1.0}, 0, 1, batch_size=5)
    resumed.load_state_dict(dataset.state_dict())
    assert first + keys(resumed) == whole


def test_upsample_reads_a_source_k_times(text: dict[str, tuple[str, list[str]]]) -> None:
    out = Counter(keys(mixture(text, {"a": 1, "b": 1, "c": 1}, 0, 1, batch_size=8, upsample={"c": 3})))
    assert {count for (name, _), count in out.items() if name == "c"} == {3}
    assert {count for (name, _), count in out.items() if name != "c"} == {1}
    assert len(out) == len(expected(text))


def test_weight_0_reads_nothing_of_a_source(text: dict[str, tuple[str, list[str]]]) -> None:
    out = keys(mixture(text, {"a": 1, "b": 0, "c": 1}, 0, 1, batch_size=8))
    assert sorted(out) == [key for key in expected(text) if key[0] != "b"]


def test_token_sources_mix_by_sequences_exactly_once(tmp_path: Path) -> None:
    a, total_a = write_tokens(tmp_path / "a", files=3, documents=20, name="a")
    b, total_b = write_tokens(tmp_path / "b", files=2, documents=25, first_id=10**6, name="b")
    settings: dict[str, Any] = {"seq_len": 16, "shuffle_buffer": 30}
    seen: Counter[int] = Counter()
    states = []
    for rank in range(3):
        dataset = MixtureDataset({"a": PackedDataset(a, **settings), "b": PackedDataset(b, **settings)},
                                 {"a": 0.75, "b": 0.25}, rank=rank, world_size=3, batch_size=2)
        loader = iter(DataLoader(dataset, batch_size=None, num_workers=2))
        for _ in range(3):
            batch = {k: np.asarray(v) for k, v in next(loader).items()}
            assert set(batch["source"].tolist()) <= {0, 1}
            seen.update(real_tokens(batch))
        states.append(dataset.state_dict(consumed=3))
    state = states[0]
    assert state["sources"]["a"]["unit"] == "tokens"
    assert state["sources"]["a"]["cursor"] + state["sources"]["b"]["cursor"] == 3 * 2 * 3 * 16
    for rank in range(2):
        dataset = MixtureDataset({"a": PackedDataset(a, **settings), "b": PackedDataset(b, **settings)},
                                 {"a": 0.5, "b": 0.5}, rank=rank, world_size=2, batch_size=4)
        dataset.load_state_dict(state)
        for batch in DataLoader(dataset, batch_size=None, num_workers=2):
            seen.update(real_tokens({k: np.asarray(v) for k, v in batch.items()}))
    want = list(range(1, total_a + 1)) + list(range(10**6, 10**6 + total_b))
    assert sorted(seen) == want and set(seen.values()) == {1}


def test_mixing_text_and_tokens_is_refused(text: dict[str, tuple[str, list[str]]], tmp_path: Path) -> None:
    prefixes, _ = write_tokens(tmp_path / "t", files=1)
    with pytest.raises(ValueError, match="not both"):
        MixtureDataset({"a": ReleaseDataset(text["a"][0]), "t": PackedDataset(prefixes, seq_len=8)},
                       {"a": 1, "t": 1}, rank=0, world_size=1)
    with pytest.raises(ValueError, match="missing"):
        MixtureDataset({"a": ReleaseDataset(text["a"][0])}, {"b": 1}, rank=0, world_size=1)


def test_token_sources_with_different_document_boundaries_are_refused(tmp_path: Path) -> None:
    """A source without document boundaries has no ``starts``: mixed with one that has them, a batch raised KeyError
    or left that source's rows of position/segment ids uninitialized."""
    a, total_a = write_tokens(tmp_path / "a", files=1, documents=10, name="a")
    b, total_b = write_tokens(tmp_path / "b", files=1, documents=10, first_id=10**6, name="b")
    for first in (True, False):
        with pytest.raises(ValueError, match="document_boundaries"):
            MixtureDataset({"a": PackedDataset(a, seq_len=8, document_boundaries=first),
                            "b": PackedDataset(b, seq_len=8, document_boundaries=not first)},
                           {"a": 1, "b": 1}, rank=0, world_size=1, batch_size=4)
    mixture = MixtureDataset({"a": PackedDataset(a, seq_len=8, document_boundaries=False),
                              "b": PackedDataset(b, seq_len=8, document_boundaries=False)},
                             {"a": 1, "b": 1}, rank=0, world_size=1, batch_size=4)
    seen: list[int] = []
    for batch in mixture:
        assert "segment_ids" not in batch.keys()
        seen.extend(real_tokens({k: np.asarray(v) for k, v in batch.items()}))
    assert sorted(seen) == list(range(1, total_a + 1)) + list(range(10**6, 10**6 + total_b))


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_workers_mix_and_resume_exactly(tmp_path: Path, workers: int) -> None:
    """StatefulDataLoader asks each worker's copy for state_dict() without consumed=: no ConsumedCountRequiredError
    in the worker, and the per-worker positions resume the same merge."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    a, total_a = write_tokens(tmp_path / "a", files=2, documents=20, name="a")
    b, total_b = write_tokens(tmp_path / "b", files=1, documents=25, first_id=10**6, name="b")

    def loader() -> Any:
        mixture = MixtureDataset({"a": PackedDataset(a, seq_len=16, shuffle_buffer=30),
                                  "b": PackedDataset(b, seq_len=16, shuffle_buffer=30)},
                                 {"a": 0.6, "b": 0.4}, rank=0, world_size=1, batch_size=3)
        return stateful.StatefulDataLoader(mixture, batch_size=None, num_workers=workers)

    def tokens(batches: Any) -> list[list[int]]:
        return [real_tokens({k: np.asarray(v) for k, v in batch.items()}) for batch in batches]

    full = tokens(loader())
    want = list(range(1, total_a + 1)) + list(range(10**6, 10**6 + total_b))
    assert sorted(t for batch in full for t in batch) == want
    for head_items in (1, 4, len(full) - 1):
        first = loader()
        iterator = iter(first)
        head = tokens(next(iterator) for _ in range(head_items))
        state = first.state_dict()
        del iterator
        fresh = loader()
        fresh.load_state_dict(state)
        assert head + tokens(fresh) == full, f"resume after {head_items} batches"


def test_a_refused_load_state_dict_leaves_the_mixture_as_it_was(text: dict[str, tuple[str, list[str]]]) -> None:
    # bad weights at a resume are refused; the epoch used to be replaced before the weights were checked
    source = mixture(text, {"a": 1, "b": 1, "c": 2}, 0, 1, batch_size=4)
    state = source.state_dict(consumed=2)
    state["epoch"] = 4
    dataset = mixture(text, {"a": 1, "b": 1, "c": 2}, 0, 1, batch_size=4)
    want = keys(mixture(text, {"a": 1, "b": 1, "c": 2}, 0, 1, batch_size=4))
    with pytest.raises(ValueError, match="weights must be finite"):
        dataset.load_state_dict(state, weights={"a": 1, "b": -1, "c": 1})
    assert dataset.epoch == 1 and keys(dataset) == want

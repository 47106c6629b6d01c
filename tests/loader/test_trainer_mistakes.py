"""A new trainer's mistakes with the loader get one error that names the file or field and the fix (not a
traceback from deep inside, not a message that sends them to re-export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from datahub.loader import MixtureDataset, PackedDataset, ReleaseDataset
from datahub.loader.errors import ManifestError
from tests.loader.shards import write_release
from tests.loader.tokens import write_tokens


def test_a_token_manifest_given_to_release_dataset_says_to_use_packed_dataset(tmp_path: Path) -> None:
    # what `datahub export --tokenizer` publishes: before, "malformed manifest, missing or bad field (KeyError:
    # 'shards'); re-run datahub export", which sent the trainer to re-export a good release
    tokens = tmp_path / "tokens-manifest.json"
    tokens.write_text(json.dumps({"manifest_version": 1, "format": "megatron-mmidx-1", "release": "r",
                                  "tokenizer": {"sha256": "0" * 64}, "files": [{"name": "r-000000"}]}))
    with pytest.raises(ManifestError, match=r"tokens-manifest.json: the manifest of a token export \(Megatron "
                                            r".bin/.idx files, read by PackedDataset\), not of WebDataset shards"):
        ReleaseDataset(str(tokens))


def test_a_release_name_not_exported_to_the_lake_lists_the_exported_ones(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    for name in ("web-v1", "code-v2"):
        write_release(lake / "_exports" / name, release=name, samples_per_shard=(2,))
    with pytest.raises(ManifestError, match=r"_exports/web-v2/manifest.json; was the release exported\? releases "
                                            r"exported to this lake: code-v2, web-v1") as error:
        ReleaseDataset("web-v2", lake=str(lake))
    assert "code-v2, web-v1" in str(error.value)
    with pytest.raises(ManifestError, match=r"no lake at .*/not-a-lake \(the directory does not exist\)"):
        ReleaseDataset("web-v1", lake=str(tmp_path / "not-a-lake"))
    assert len(ReleaseDataset("web-v1", lake=str(lake)).manifest.shards) == 1


@pytest.mark.parametrize("state", [None, "checkpoint.pt", 3])
def test_load_state_dict_of_something_not_a_state_names_what_to_pass(tmp_path: Path, state: object) -> None:
    write_release(tmp_path / "export", samples_per_shard=(3,))
    prefixes, _ = write_tokens(tmp_path / "tok", files=1, documents=4)
    datasets: list[Any] = [ReleaseDataset(str(tmp_path / "export" / "manifest.json")),
                           PackedDataset(prefixes, seq_len=8)]
    datasets.append(MixtureDataset({"a": datasets[1]}, {"a": 1.0}, batch_size=2))
    for dataset in datasets:
        with pytest.raises(TypeError, match=rf"{type(dataset).__name__}.load_state_dict takes the dict "
                                            r"state_dict\(\) returned \(e.g. torch.load\(path\)\[\"data\"\]\); got "):
            dataset.load_state_dict(state)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["data", "loader"])
def test_load_state_dict_of_the_whole_checkpoint_says_to_pass_its_data_entry(tmp_path: Path, key: str) -> None:
    # the README saves {"data": dataset.state_dict(...), "model": ..., "step": ...}; passing that whole dict said
    # "not a ReleaseDataset state (format None, expected 'datahub.loader/3')", which does not say what to pass
    write_release(tmp_path / "export", samples_per_shard=(3,))
    prefixes, _ = write_tokens(tmp_path / "tok", files=1, documents=4)
    datasets: list[Any] = [ReleaseDataset(str(tmp_path / "export" / "manifest.json")),
                           PackedDataset(prefixes, seq_len=8)]
    datasets.append(MixtureDataset({"a": datasets[1]}, {"a": 1.0}, batch_size=2))
    for dataset in datasets:
        checkpoint = {"model": {"w": 1}, key: dataset.state_dict(), "step": 3}
        with pytest.raises(ValueError, match=rf"{type(dataset).__name__}.load_state_dict got a whole checkpoint "
                                             rf"\(keys 'model', '{key}', 'step'\), not a state: pass "
                                             rf"checkpoint\['{key}'\]"):
            dataset.load_state_dict(checkpoint)
        dataset.load_state_dict(checkpoint[key])
    with pytest.raises(ValueError, match=r"not a ReleaseDataset state \(format None"):  # no state inside: as before
        datasets[0].load_state_dict({"model": {"w": 1}, "data": {"step": 3}})


@pytest.mark.parametrize(("field", "value", "message"), [
    ("shuffle_buffer", -1, r"shuffle_buffer must be >= 0; got -1"),
    ("prefetch_shards", -1, r"prefetch_shards must be >= 0; got -1"),
    ("seed", "a", r"seed must be an integer; got 'a'"),
])
def test_release_dataset_refuses_a_bad_setting_naming_it(tmp_path: Path, field: str, value: object,
                                                         message: str) -> None:
    write_release(tmp_path / "export", samples_per_shard=(3,))
    with pytest.raises(ValueError, match=message):
        ReleaseDataset(str(tmp_path / "export" / "manifest.json"), **{field: value})  # type: ignore[arg-type]


def test_a_tier_preference_that_leaves_out_every_local_token_replica_names_them(tmp_path: Path) -> None:
    # a typo in tier_preference said "no local replica ... Copy the release to a cfs tier: datahub tier apply ...",
    # while two local replicas were there, on tiers the trainer's list left out (ReleaseDataset names them)
    from datahub.errors import SpecError
    from tests.loader.test_packing import _two_tier_token_manifest

    path, _ = _two_tier_token_manifest(write_tokens(tmp_path / "tokens", files=1, documents=5), tmp_path / "tiers")
    with pytest.raises(SpecError, match=r"no local replica among tier_preference \['nvm'\], which leaves out every "
                                        r"tier holding one \(cfs, nvme\): add one to tier_preference, or leave it "
                                        r"out") as error:
        PackedDataset(str(path), seq_len=8, tier_preference=["nvm"])
    assert "tier apply" not in str(error.value)
    assert PackedDataset(str(path), seq_len=8, tier_preference=["nvm", "nvme"]).num_tokens > 0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("shuffle_buffer", -1, r"shuffle_buffer must be >= 0; got -1"),
    ("seed", "a", r"seed must be an integer; got 'a'"),
    ("epoch", None, r"epoch must be an integer; got None"),
])
def test_packed_dataset_refuses_a_bad_setting_naming_it(tmp_path: Path, field: str, value: object,
                                                        message: str) -> None:
    prefixes, _ = write_tokens(tmp_path / "tok", files=1, documents=4)
    with pytest.raises(ValueError, match=message):
        PackedDataset(prefixes, seq_len=8, **{field: value})  # type: ignore[arg-type]


def test_mixture_sources_given_as_a_list_say_to_name_them(tmp_path: Path) -> None:
    prefixes, _ = write_tokens(tmp_path / "tok", files=1, documents=4)
    with pytest.raises(TypeError, match=r"MixtureDataset sources must be a dict of name -> dataset, e.g. "
                                        r"\{'web': web, 'code': code\}, with weights by the same names; got list"):
        MixtureDataset([PackedDataset(prefixes, seq_len=8)], {"a": 1.0}, batch_size=2)  # type: ignore[arg-type]


def test_a_token_batch_shows_the_arrays_a_trainer_can_index(tmp_path: Path) -> None:
    # its repr listed the compact form (tokens, lengths, starts): batch["lengths"] is a KeyError
    prefixes, _ = write_tokens(tmp_path / "tok", files=1, documents=8)
    batch = next(iter(PackedDataset(prefixes, seq_len=8, batch_size=2)))
    assert repr(batch) == ("TokenBatch(tokens[2, 8] int32, loss_mask[2, 8] bool, position_ids[2, 8] int32, "
                           "segment_ids[2, 8] int32)")
    assert all(key in repr(batch) for key in batch.keys())

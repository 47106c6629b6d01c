"""Region-aware replica order: a reader prefers the tiers of its own region and fails over to the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datahub.loader.dataset import ReleaseDataset
from datahub.loader.regions import reader_region, region_order
from datahub.storage.config import load_storage_config
from tests.loader.shards import all_ids, write_release

TIERS = ("home", "eu")  # two cfs tiers in two directories standing for two regions


@pytest.fixture
def two_regions(tmp_path: Path) -> tuple[dict, Path]:
    manifest = write_release(tmp_path, samples_per_shard=(5, 5, 5), tiers=TIERS)
    storage = tmp_path / "storage.yaml"
    storage.write_text(json.dumps({"tiers": {
        "home": {"kind": "cfs", "path": str(tmp_path / "home"), "region": "us-east"},
        "eu": {"kind": "cfs", "path": str(tmp_path / "eu"), "region": "eu-west"}}}))
    return manifest, storage


def read(tmp_path: Path, storage: Path, **kwargs) -> ReleaseDataset:
    return ReleaseDataset(str(tmp_path / "manifest.json"), storage=storage, rank=0, world_size=1, shuffle=False,
                          prefetch_shards=0, **kwargs)


def test_region_order_puts_the_own_region_first_and_keeps_the_rest() -> None:
    regions = {"a": "us", "b": "eu", "c": None, "d": "eu"}
    assert region_order(["a", "b", "c", "d"], regions, "eu") == ["b", "d", "a", "c"]
    assert region_order(["a", "b", "c", "d"], regions, None) == ["a", "b", "c", "d"]
    assert reader_region(None, {"DATAHUB_REGION": "eu"}) == "eu"
    assert reader_region("us", {"DATAHUB_REGION": "eu"}) == "us"
    assert reader_region(None, {"DATAHUB_REGION": ""}) is None


def test_reader_reads_its_own_regions_replicas(tmp_path: Path, two_regions: tuple[dict, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, storage = two_regions
    monkeypatch.delenv("DATAHUB_REGION", raising=False)
    unplaced = read(tmp_path, storage)  # no region: the manifest's order
    assert [s["sample_id"] for s in unplaced] == all_ids(manifest)
    assert {tier for tier, _ in unplaced.source.reads} == {"home"}
    for region in TIERS:
        dataset = read(tmp_path, storage, region=load_storage_config(storage).tiers[region].region)
        assert [s["sample_id"] for s in dataset] == all_ids(manifest)
        assert {tier for tier, _ in dataset.source.reads} == {region}
    monkeypatch.setenv("DATAHUB_REGION", "eu-west")
    dataset = read(tmp_path, storage)
    assert [s["sample_id"] for s in dataset] == all_ids(manifest)
    assert {tier for tier, _ in dataset.source.reads} == {"eu"}
    explicit = read(tmp_path, storage, tier_preference=["home", "eu"])  # an explicit preference wins
    assert [s["sample_id"] for s in explicit] == all_ids(manifest)
    assert {tier for tier, _ in explicit.source.reads} == {"home"}


def test_missing_replica_in_the_own_region_fails_over_to_the_other(tmp_path: Path,
                                                                    two_regions: tuple[dict, Path]) -> None:
    manifest, storage = two_regions
    lost = manifest["shards"][1]["name"]
    (tmp_path / "eu" / lost).unlink()
    dataset = read(tmp_path, storage, region="eu-west")
    assert [s["sample_id"] for s in dataset] == all_ids(manifest)
    assert dataset.source.failovers["eu"] == 1
    assert dataset.source.reads[("home", lost)] == 1
    assert {name for tier, name in dataset.source.reads if tier == "eu"} == {
        s["name"] for s in manifest["shards"]} - {lost}

"""PackedDataset prefers the token replica in its own region (``region=`` or ``DATAHUB_REGION``, the rule of
``ReleaseDataset``: ``datahub.loader.regions``) and fails over to another region's replica when its own is missing
or damaged. Real token files: a token export to a cfs tier labelled us-east, copied by ``tier apply`` to a cfs tier
labelled eu-west; read through a real DataLoader with workers."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.errors import SpecError  # noqa: E402
from datahub.export.tiering import apply_tiers, plan_tiers  # noqa: E402
from datahub.loader.errors import NoReadableReplicaError  # noqa: E402
from datahub.loader.packing import PackedDataset  # noqa: E402
from datahub.shards.token_manifest import TokenManifest, read_lake_token_manifest, token_dir  # noqa: E402
from datahub.storage import load_storage_config  # noqa: E402
from tests.export.test_token_tiering import _exported  # noqa: E402
from tests.loader.tokens import real_tokens  # noqa: E402

REGIONS = {"home": "us-east", "eu": "eu-west"}  # "eu" sorts first: the order without a region
SETTINGS: dict[str, Any] = {"seq_len": 16, "seed": 2, "shuffle_buffer": 20, "batch_size": 2}


def _storage_yaml(tmp_path: Path, tiers: dict[str, dict[str, Any]]) -> Path:
    path = tmp_path / "storage.yaml"
    path.write_text(json.dumps({"tiers": tiers}))
    return path


@pytest.fixture
def two_regions(tmp_path: Path) -> tuple[Path, Path, TokenManifest]:
    """(token manifest path in the lake, storage YAML, the manifest): every token file on both regions' tiers."""
    yaml_path = _storage_yaml(tmp_path, {name: {"kind": "cfs", "path": str(tmp_path / name), "region": region}
                                         for name, region in REGIONS.items()})
    storage = load_storage_config(yaml_path)
    lake, tokens = _exported(tmp_path, storage, tier="home")
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["home", "eu"]}), storage=storage)
    manifest = read_lake_token_manifest(lake, "r")
    assert manifest is not None and manifest.tiers == ["eu", "home"]
    return tmp_path / "lake" / "_exports" / "r" / f"{token_dir(tokens.tokenizer.sha256)}.json", yaml_path, manifest


def _tiers_read(dataset: PackedDataset, manifest: TokenManifest) -> list[str]:
    """The tier each token file was opened from (by its prefix)."""
    by_prefix = {uri: tier for record in manifest.files for tier, uri in record.replicas.items()}
    return [by_prefix[files.prefix] for files in dataset.files.files]


def _tokens(dataset: PackedDataset, workers: int = 2) -> list[int]:
    out: list[int] = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=workers):
        out += real_tokens({key: np.asarray(value) for key, value in batch.items()})
    return out


def test_packed_dataset_reads_its_own_regions_token_replicas(two_regions, monkeypatch) -> None:
    path, storage, manifest = two_regions
    files = len(manifest.files)
    monkeypatch.delenv("DATAHUB_REGION", raising=False)
    unplaced = PackedDataset(str(path), storage=storage, **SETTINGS)  # no region: the manifest's (sorted) order
    assert _tiers_read(unplaced, manifest) == ["eu"] * files
    expected = Counter(_tokens(unplaced, workers=0))
    assert sum(expected.values()) == unplaced.num_tokens
    for tier, region in REGIONS.items():
        dataset = PackedDataset(str(path), storage=storage, region=region, **SETTINGS)
        assert _tiers_read(dataset, manifest) == [tier] * files
        assert Counter(_tokens(dataset)) == expected  # the same stream from either region, through 2 workers
    monkeypatch.setenv("DATAHUB_REGION", "us-east")
    assert _tiers_read(PackedDataset(str(path), storage=storage, **SETTINGS), manifest) == ["home"] * files
    # an explicit preference wins over the region, as for ReleaseDataset
    explicit = PackedDataset(str(path), storage=storage, tier_preference=["eu", "home"], **SETTINGS)
    assert _tiers_read(explicit, manifest) == ["eu"] * files
    # region="" means no region, whatever DATAHUB_REGION says
    assert _tiers_read(PackedDataset(str(path), storage=storage, region="", **SETTINGS), manifest) == ["eu"] * files


def test_a_missing_or_damaged_replica_in_the_own_region_fails_over_to_the_other(two_regions, caplog) -> None:
    path, storage, manifest = two_regions
    expected = Counter(_tokens(PackedDataset(str(path), storage=storage, region="us-east", **SETTINGS), workers=0))
    flipped = Path(f"{manifest.files[0].replicas['eu']}.bin")
    data = bytearray(flipped.read_bytes())
    data[0] ^= 1  # same size: only the sha256 tells
    flipped.write_bytes(bytes(data))
    Path(f"{manifest.files[2].replicas['eu']}.idx").unlink()
    with caplog.at_level(logging.WARNING, logger="datahub.loader"):
        dataset = PackedDataset(str(path), storage=storage, region="eu-west", **SETTINGS)
    assert _tiers_read(dataset, manifest) == ["home" if i in (0, 2) else "eu" for i in range(len(manifest.files))]
    assert Counter(_tokens(dataset)) == expected
    warned = [r.getMessage() for r in caplog.records if "token file" in r.getMessage()]
    assert len(warned) == 1 and "tier eu unusable" in warned[0]  # once per tier
    Path(f"{manifest.files[2].replicas['home']}.idx").unlink()  # no good replica left in either region
    with pytest.raises(NoReadableReplicaError) as error:
        PackedDataset(str(path), storage=storage, region="eu-west", **SETTINGS)
    message = str(error.value)
    assert manifest.files[2].prefix in message and "eu (" in message and "home (" in message
    assert "datahub tier apply" in message and "--release r" in message


def test_no_local_replica_names_the_file_the_tiers_and_the_copy_that_fixes_it(two_regions, tmp_path) -> None:
    """Token files are memory-mapped: a replica on an object store is not readable. The error names the file, the
    tiers holding it (with their regions) and the tier apply that brings it to a cfs tier of the reader's region."""
    path, _, manifest = two_regions
    remote = {"kind": "ceph", "endpoint_url": "http://127.0.0.1:9", "bucket": "b", "region": "eu-west"}
    storage = _storage_yaml(tmp_path, {"ceph-eu": remote, **{name: {"kind": "cfs", "path": str(tmp_path / name),
                                                                    "region": region}
                                                             for name, region in REGIONS.items()}})
    raw = json.loads(path.read_text())
    for record in raw["files"]:  # the release moved to Ceph only (as a tier apply --tiers ceph-eu leaves it)
        record["replicas"] = {"ceph-eu": f"s3://b/r/{Path(record['replicas']['eu']).parent.name}/{record['prefix']}"}
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(raw))
    with pytest.raises(SpecError) as error:
        PackedDataset(str(moved), storage=storage, region="eu-west", **SETTINGS)
    message = str(error.value)
    assert manifest.files[0].prefix in message and "ceph-eu (eu-west)" in message
    assert "memory-maps" in message and "--release r --tiers ceph-eu,eu" in message  # eu: the reader's region's cfs

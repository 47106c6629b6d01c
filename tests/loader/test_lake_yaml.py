"""``ReleaseDataset(name, lake=LAKE.yaml)``: the loader takes a lake YAML as every command's ``--lake`` does, so a
trainer on an S3 lake reads the release's manifest with the YAML's endpoint and keys (no ambient AWS_* variables)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from datahub.errors import SpecError
from datahub.loader.dataset import ReleaseDataset
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.loader.shards import all_ids, write_release


@pytest.mark.ceph
def test_a_release_name_on_an_s3_lake_given_as_a_lake_yaml(tmp_path: Path, ceph_s3: S3Endpoint,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                 "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))  # no credentials from ~/.aws either
    manifest = write_release(tmp_path / "export", samples_per_shard=(4, 3))  # shards on a local cfs tier
    bucket = ceph_s3.new_bucket("lakeyaml")
    ceph_s3.filesystem().pipe_file(f"{bucket}/lake/_exports/demo-v1/manifest.json", json.dumps(manifest).encode())
    lake_yaml = tmp_path / "s3lake.yaml"
    options = {**ceph_s3.storage_options(), "AWS_SECRET_ACCESS_KEY": "${LAKE_TEST_SECRET}"}  # ${VAR} as in --lake
    lake_yaml.write_text(yaml.safe_dump({"root": f"s3://{bucket}/lake", "storage_options": options}))
    monkeypatch.setenv("LAKE_TEST_SECRET", ceph_s3.secret)

    dataset = ReleaseDataset("demo-v1", lake=str(lake_yaml), rank=0, world_size=1, shuffle=False)
    assert sorted(sample["sample_id"] for sample in dataset) == all_ids(manifest)
    assert len(list(ReleaseDataset("demo-v1", lake=lake_yaml, rank=0, world_size=1))) == 7  # a pathlib.Path too


def test_a_lake_yaml_error_names_the_file(tmp_path: Path) -> None:
    storage = tmp_path / "storage.yaml"
    storage.write_text("tiers: {cfs: {kind: cfs, root: /mnt/cfs}}\n")
    with pytest.raises(SpecError, match="storage.yaml: a storage config"):
        ReleaseDataset("demo-v1", lake=str(storage), rank=0, world_size=1)
    with pytest.raises(SpecError, match="lake file not found"):
        ReleaseDataset("demo-v1", lake=str(tmp_path / "missing.yaml"), rank=0, world_size=1)

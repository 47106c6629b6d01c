"""Region-aware reads against the real Ceph RGW: a reader in the Ceph tier's region reads from the RGW, one in
the cfs tier's region from the mount, and a replica missing on the RGW fails over to the other region."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from datahub.loader.dataset import ReleaseDataset
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.loader.shards import all_ids
from tests.loader.test_ceph import PREFIX, credentials_file, on_ceph  # noqa: F401

pytestmark = pytest.mark.ceph


def test_reader_prefers_its_regions_tier_and_fails_over(tmp_path: Path, ceph_s3: S3Endpoint,
                                                        on_ceph: tuple[dict[str, Any], str]) -> None:
    manifest, bucket = on_ceph
    storage = tmp_path / "storage.yaml"
    storage.write_text(yaml.safe_dump({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs"), "region": "us-east"},
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": PREFIX,
                 "region": "eu-west", "s3_region": ceph_s3.region,
                 "credentials": {"file": credentials_file(tmp_path, ceph_s3)}}}}))
    names = [shard["name"] for shard in manifest["shards"]]

    def read(region: str) -> ReleaseDataset:
        dataset = ReleaseDataset(str(tmp_path / "manifest.json"), storage=storage, region=region, rank=0,
                                 world_size=1, shuffle=False, prefetch_shards=0)
        assert [s["sample_id"] for s in dataset] == all_ids(manifest)
        return dataset

    assert set(read("eu-west").source.reads) == {("ceph", name) for name in names}
    assert set(read("us-east").source.reads) == {("cfs", name) for name in names}
    ceph_s3.filesystem().rm_file(f"{bucket}/{PREFIX}/demo-v1/{names[1]}")
    failed_over = read("eu-west")
    assert set(failed_over.source.reads) == {("ceph", names[0]), ("cfs", names[1]), ("ceph", names[2])}
    assert failed_over.source.failovers["ceph"] == 1

"""Engine export to the real Ceph RGW: Ray tasks publish whole shards to S3, same bytes as one process."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from datahub.export import export_table_version, read_lake_manifest
from datahub.storage import validate_storage_config
from tests.ceph import ceph_s3  # noqa: F401
from tests.export.helpers import make_lake

pytestmark = pytest.mark.ceph


def test_ray_export_to_ceph_matches_a_local_export(tmp_path, ceph_s3, ray_engine) -> None:
    bucket = ceph_s3.new_bucket("engine-export")
    credentials = tmp_path / "ceph.credentials"  # read by every Ray worker: engine tasks resolve the tier themselves
    credentials.write_text(f"access_key_id = {ceph_s3.key}\nsecret_access_key = {ceph_s3.secret}\n")
    storage = validate_storage_config({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
                 "region": ceph_s3.region, "credentials": {"file": str(credentials)}},
    }}, source="storage.yaml")
    lake, version = make_lake(tmp_path / "lake", 120, with_binary=True)
    settings = {"shard_size": 24000, "shuffle_seed": 3}
    local = export_table_version(lake, table="samples", version=version, release_name="local", tier="cfs",
                                 storage=storage, **settings)
    remote = export_table_version(lake, table="samples", version=version, release_name="remote", tier="ceph",
                                  storage=storage, engine=ray_engine, workers=2, **settings)
    assert len(remote.shards) == len(local.shards) > 2
    fs = ceph_s3.filesystem()
    for mine, theirs in zip(remote.shards, local.shards):
        data = fs.cat(mine.replicas["ceph"])
        assert data == Path(theirs.replicas["cfs"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == mine.sha256
    assert read_lake_manifest(lake, "remote") == remote
    assert not fs.exists(f"{bucket}/releases/remote/_partial")

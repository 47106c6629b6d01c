"""The ceph tier and a lake on Ceph RGW (real radosgw on loopback, from tests/ceph.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from datahub.export import export_table_version, read_lake_manifest
from datahub.export.tiering import apply_tiers, plan_tiers
from datahub.storage import validate_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.export.helpers import make_lake

pytestmark = pytest.mark.ceph


def _storage(tmp_path, ceph: S3Endpoint, bucket: str, monkeypatch):
    monkeypatch.setenv("DH_TEST_CEPH_KEY", ceph.key)
    monkeypatch.setenv("DH_TEST_CEPH_SECRET", ceph.secret)
    return validate_storage_config({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
        "ceph": {"kind": "ceph", "endpoint_url": ceph.endpoint_url, "bucket": bucket, "prefix": "releases",
                 "region": ceph.region, "credentials": {"key_env": "DH_TEST_CEPH_KEY", "secret_env": "DH_TEST_CEPH_SECRET"}},
    }}, source="storage.yaml")


def test_export_to_ceph_then_move_to_cfs(tmp_path, ceph_s3, monkeypatch) -> None:
    bucket = ceph_s3.new_bucket("export")
    storage = _storage(tmp_path, ceph_s3, bucket, monkeypatch)
    lake, version = make_lake(tmp_path / "lake", 90)
    manifest = export_table_version(lake, table="samples", version=version, release_name="c1", tier="ceph",
                                    storage=storage, shard_samples=40)
    fs = ceph_s3.filesystem()
    keys = sorted(k.rsplit("/", 1)[-1] for k in fs.ls(f"{bucket}/releases/c1", detail=False, refresh=True))
    assert keys == ["c1-000000.tar", "c1-000001.tar", "c1-000002.tar", "manifest.json"]
    for shard in manifest.shards:
        assert shard.replicas["ceph"] == f"s3://{bucket}/releases/c1/{shard.name}"
        assert hashlib.sha256(fs.cat(shard.replicas["ceph"])).hexdigest() == shard.sha256
    published = fs.cat(f"{bucket}/releases/c1/manifest.json")
    assert ceph_s3.secret.encode() not in published and ceph_s3.key.encode() not in published

    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"c1": ["cfs"]}), storage=storage)
    moved = read_lake_manifest(lake, "c1")
    fs.invalidate_cache()
    assert moved.tiers == ["cfs"] and not fs.exists(f"{bucket}/releases/c1/c1-000000.tar")
    for shard in moved.shards:
        assert hashlib.sha256(open(shard.replicas["cfs"], "rb").read()).hexdigest() == shard.sha256


def test_lake_on_ceph_runs_a_job_exports_and_inspects(tmp_path, ceph_s3, job_spec, ray_engine, monkeypatch) -> None:
    from datahub.cli.commands.inspect import inspect_lake
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job

    bucket = ceph_s3.new_bucket("lake")
    root = f"s3://{bucket}/lake"
    options = ceph_s3.storage_options()
    result = run_job(job_spec(lake={"root": root, "storage_options": options}), engine=ray_engine)
    assert result.status == "succeeded"
    info = inspect_lake(root, storage_options=options)
    assert info["tables"]["samples"]["rows"] == result.counts["samples_written"] > 0
    assert {"samples", "lineage", "runs"} <= set(info["tables"])

    lake = Lake(root, storage_options=options)
    samples = lake.read("samples")
    import pyarrow.compute as pc

    first = pc.index_in(samples["sample_id"], value_set=pc.unique(samples["sample_id"]))
    keep = sorted({int(v): i for i, v in reversed(list(enumerate(first.to_pylist())))}.values())
    version = lake.commit("samples_unique", samples.take(keep), txn="test/unique")
    storage = _storage(tmp_path, ceph_s3, ceph_s3.new_bucket("shards"), monkeypatch)
    manifest = export_table_version(lake, table="samples_unique", version=version, release_name="demo-v1",
                                    tier="ceph", storage=storage, shard_samples=100)
    assert manifest.num_samples == len(keep)
    in_lake = json.loads(ceph_s3.filesystem().cat(f"{bucket}/lake/_exports/demo-v1/manifest.json"))
    assert in_lake == manifest.to_dict()
    exported = lake.read("lineage").filter(pc.equal(lake.read("lineage")["action"], "exported"))
    assert exported.num_rows == len(keep)

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
    from datahub.lake import Lake
    from datahub.lake.describe import describe_lake
    from datahub.pipeline.run import run_job

    bucket = ceph_s3.new_bucket("lake")
    root = f"s3://{bucket}/lake"
    options = ceph_s3.storage_options()
    result = run_job(job_spec(lake={"root": root, "storage_options": options}), engine=ray_engine)
    assert result.status == "succeeded"
    info = describe_lake(Lake(root, storage_options=options))
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


def test_cli_release_export_and_inspect_an_s3_lake_with_options_from_a_lake_file(tmp_path, ceph_s3) -> None:
    """`--lake lake.yaml` carries the lake's storage options; the CLI runs with no AWS_* variables at all."""
    import os
    import subprocess
    import sys

    import yaml

    bucket = ceph_s3.new_bucket("cli-lake")
    root = f"s3://{bucket}/lake"
    make_lake(root, 40, storage_options=ceph_s3.storage_options())
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(yaml.safe_dump({"root": root, "storage_options": {
        **ceph_s3.storage_options(), "AWS_ALLOW_HTTP": True}}))  # a YAML bool: must reach delta-rs as "true"
    lake_file.chmod(0o600)
    creds = tmp_path / "ceph.credentials"
    creds.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    shards = ceph_s3.new_bucket("cli-shards")
    storage = tmp_path / "storage.yaml"
    storage.write_text(yaml.safe_dump({"tiers": {"ceph": {
        "kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": shards, "region": ceph_s3.region,
        "credentials": {"file": str(creds)}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DATAHUB_TEST_S3_"))}
    env.update(HOME=str(tmp_path), RAY_AUTH_MODE="disabled")  # no ~/.aws either

    def datahub(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"datahub {' '.join(args)}:\n{done.stdout}\n{done.stderr[-3000:]}"
        return done.stdout

    datahub("release", "create", "s3r", "--lake", str(lake_file), "--json")
    manifest = json.loads(datahub("export", "s3r", "--lake", str(lake_file), "--tier", "ceph", "--storage", str(storage),
                                  "--shard-size", "40KB", "--json"))
    assert manifest["release"] == "s3r" and manifest["table"] == "samples" and manifest["num_samples"] == 40
    assert all(s["size"] <= 40_000 for s in manifest["shards"]) and len(manifest["shards"]) >= 2
    fs = ceph_s3.filesystem()
    for shard in manifest["shards"]:
        assert hashlib.sha256(fs.cat(shard["replicas"]["ceph"])).hexdigest() == shard["sha256"]
    assert json.loads(fs.cat(f"{bucket}/lake/_exports/s3r/manifest.json")) == manifest
    info = json.loads(datahub("inspect", str(lake_file), "--json"))
    assert info["lake"] == root
    assert info["tables"]["samples"]["rows"] == 40 and info["tables"]["releases"]["rows"] == 1
    assert info["tables"]["lineage"]["rows"] == 80  # released + exported, one each per sample


def test_live_writes_on_ceph_see_a_fresh_journal_not_published_shards(tmp_path, ceph_s3, monkeypatch) -> None:
    """What spares a running second-tier export from tier apply's leftover delete, on S3 (LastModified)."""
    from datahub.storage import Tier

    bucket = ceph_s3.new_bucket("live")
    storage = _storage(tmp_path, ceph_s3, bucket, monkeypatch)
    tier = Tier.from_config(storage, "ceph")
    tier.publish(tier.uri("R", "R-000000.tar"), b"shard")
    assert tier.live_writes(tier.uri("R"), within=3600) == []
    tier.publish(tier.uri("R", "_partial", "key", "000000.json"), b"{}")
    assert [p.rsplit("/", 1)[-1] for p in tier.live_writes(tier.uri("R"), within=3600)] == ["000000.json"]
    assert tier.live_writes(tier.uri("R"), within=-60) == []  # written over a minute "ago": abandoned
    assert tier.live_writes(tier.uri("nothing"), within=3600) == []


def test_second_tier_export_to_ceph_publishes_after_checking_its_shards(tmp_path, ceph_s3, monkeypatch) -> None:
    """The size check before a second tier's manifest reads fresh S3 state (not a listing s3fs cached earlier)."""
    bucket = ceph_s3.new_bucket("second")
    storage = _storage(tmp_path, ceph_s3, bucket, monkeypatch)
    lake, version = make_lake(tmp_path / "lake", 60)
    export_table_version(lake, table="samples", version=version, release_name="s1", tier="cfs", storage=storage,
                         shard_samples=20)
    manifest = export_table_version(lake, table="samples", version=version, release_name="s1", tier="ceph",
                                    storage=storage, shard_samples=20)
    assert manifest.tiers == ["ceph", "cfs"] and len(manifest.shards) == 3

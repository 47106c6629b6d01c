"""A cross-region tier copy on the real Ceph RGW, SIGKILLed in the middle and re-run.

A release exported to a cfs tier in region us-east is copied by `datahub tier apply` (a CLI subprocess, two
storage YAMLs, one per region) to a Ceph tier in region eu-west; the process is killed by SIGKILL after the
second shard landed (``tier:after_shard:1``). The half-copied state must not be published (no manifest names
the ceph tier, the loader in eu-west still reads from cfs); the re-run copies only what is missing (the bucket
is versioned: every shard key holds exactly one version afterwards), verifies sha256, and a loader in eu-west
then reads every sample exactly once, all from Ceph.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from datahub.export import export_table_version, read_lake_manifest
from datahub.loader.dataset import ReleaseDataset
from datahub.pipeline.faults import KILL_AT_ENV
from datahub.shards.index import index_tar
from datahub.shards.manifest import Manifest
from datahub.storage import validate_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.export.helpers import make_lake

pytestmark = pytest.mark.ceph

REPO = Path(__file__).resolve().parents[2]
PREFIX = "releases"


def _tier_apply(lake: Path, east: Path, west: Path, *, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    args = ["tier", "apply", "--lake", str(lake), "--storage", str(east), "--storage", str(west),
            "--release", "r1", "--tiers", "cfs,ceph", "--json"]
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO, check=False)


def _manifest(lake: Any) -> Manifest:
    manifest = read_lake_manifest(lake, "r1")
    assert manifest is not None
    return manifest


def _read(lake: Path, storage: Path) -> ReleaseDataset:
    return ReleaseDataset("r1", lake=str(lake), storage=storage, region="eu-west", rank=0, world_size=1,
                          shuffle=False, prefetch_shards=0)


def test_cross_region_tier_copy_resumes_after_sigkill(tmp_path: Path, ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("tier-resume")
    fs = ceph_s3.filesystem()
    fs.make_bucket_versioned(bucket)  # a shard written twice would leave two versions
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    cfs: dict[str, Any] = {"kind": "cfs", "path": str(tmp_path / "cfs"), "region": "us-east"}
    ceph: dict[str, Any] = {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": PREFIX,
                            "region": "eu-west", "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}}
    east, west, both = tmp_path / "east.yaml", tmp_path / "west.yaml", tmp_path / "both.yaml"
    east.write_text(yaml.safe_dump({"tiers": {"cfs": cfs}}))
    west.write_text(yaml.safe_dump({"tiers": {"ceph": ceph}}))
    both.write_text(yaml.safe_dump({"tiers": {"cfs": cfs, "ceph": ceph}}))

    lake_root = tmp_path / "lake"
    lake, version = make_lake(lake_root, 100)
    manifest = export_table_version(lake, table="samples", version=version, release_name="r1", tier="cfs",
                                    storage=validate_storage_config({"tiers": {"cfs": cfs}}, source=str(east)),
                                    shard_samples=20)
    names = [s.name for s in manifest.shards]
    assert len(names) == 5
    expected_ids = sorted(lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist())

    def on_ceph() -> set[str]:
        fs.invalidate_cache()
        return {p.rsplit("/", 1)[-1] for p in fs.find(f"{bucket}/{PREFIX}/r1")}

    killed = _tier_apply(lake_root, east, west, kill_at="tier:after_shard:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    landed = on_ceph()
    # shards 0 and 1 were verified before the kill, shard 2 may have been in flight (2 copies at once), 3 and 4
    # were never started; the manifest (lake and tiers) still names only cfs
    assert {names[0], names[1]} <= landed <= {names[0], names[1], names[2]}, landed
    assert _manifest(lake).tiers == ["cfs"]
    assert all(set(s.replicas) == {"cfs"} for s in _manifest(lake).shards)
    before = _read(lake_root, both)
    assert sorted(s["sample_id"] for s in before) == expected_ids
    assert set(before.source.reads) == {("cfs", name) for name in names}  # no ceph replica is visible yet

    resumed = _tier_apply(lake_root, east, west)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    moves = json.loads(resumed.stdout)["moves"]
    assert [(m["action"], m["tier"], m["source"]) for m in moves] == [("copy", "ceph", "cfs")]
    assert set(names) | {"manifest.json"} <= on_ceph()
    versioned = ceph_s3.filesystem(version_aware=True)
    for name in names:  # nothing copied twice: the shards landed before the kill were verified, not rewritten
        versions = versioned.object_version_info(f"{bucket}/{PREFIX}/r1/{name}")
        assert len(versions) == 1, (name, versions)
    published = _manifest(lake)
    assert sorted(published.tiers) == ["ceph", "cfs"]
    ceph_tier = validate_storage_config({"tiers": {"ceph": ceph}}, source=str(west)).tier("ceph")
    for shard in published.shards:  # sha256 at the destination matches the manifest
        assert ceph_tier.verify(shard.replicas["ceph"], size=shard.size, sha256=shard.checksum)
    # the lineage index of the copy (from ranged reads of each Ceph shard's __index__) names every sample once,
    # in the shard that holds it
    copied = [r for r in lake.read("lineage").to_pylist() if r["run_id"] == "export/r1/ceph"]
    truth = {key: shard.replicas["ceph"] for shard in published.shards
             for key in index_tar(ceph_tier.read(shard.replicas["ceph"]), where=shard.name).keys}
    assert {r["sample_id"]: json.loads(r["ref"])["shard"] for r in copied} == truth
    assert len(copied) == len(truth) == len(expected_ids)

    after = _read(lake_root, both)
    read_ids = Counter(s["sample_id"] for s in after)
    assert sorted(read_ids) == expected_ids and set(read_ids.values()) == {1}  # every sample exactly once
    assert set(after.source.reads) == {("ceph", name) for name in names}

    again = _tier_apply(lake_root, east, west)  # a third apply is a no-op
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["moves"] == []

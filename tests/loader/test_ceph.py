"""ReleaseDataset against the real Ceph RGW: a release read from a ceph tier, failover from CFS to Ceph, and the
export's storage YAML (credentials from a file or env variables) accepted as ``storage=``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from datahub.errors import SpecError
from datahub.loader.dataset import ReleaseDataset
from datahub.storage import load_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.loader.shards import all_ids, write_release

pytestmark = pytest.mark.ceph

PREFIX = "releases"


@pytest.fixture
def on_ceph(tmp_path: Path, ceph_s3: S3Endpoint) -> tuple[dict[str, Any], str]:
    """A release with a cfs replica (local) and a ceph replica (RGW) of every shard, manifest on both; the bucket."""
    manifest = write_release(tmp_path, samples_per_shard=(6, 5, 4), text_bytes=500)
    bucket = ceph_s3.new_bucket("loader")
    fs = ceph_s3.filesystem()
    for shard in manifest["shards"]:
        uri = f"s3://{bucket}/{PREFIX}/demo-v1/{shard['name']}"  # the layout datahub.storage.Tier.uri writes
        fs.pipe_file(uri[len("s3://"):], Path(shard["replicas"]["cfs"]).read_bytes())
        shard["replicas"]["ceph"] = uri
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    fs.pipe_file(f"{bucket}/{PREFIX}/demo-v1/manifest.json", json.dumps(manifest).encode())
    return manifest, bucket


def storage_yaml(tmp_path: Path, ceph_s3: S3Endpoint, bucket: str, credentials: dict[str, str]) -> Path:
    config = {"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": PREFIX,
                 "region": ceph_s3.region, "credentials": credentials},
    }}
    path = tmp_path / "storage.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def credentials_file(tmp_path: Path, ceph_s3: S3Endpoint) -> str:
    path = tmp_path / "ceph.credentials"
    path.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    return str(path)


def test_reads_a_release_and_its_manifest_from_ceph(ceph_s3: S3Endpoint, on_ceph: tuple[dict[str, Any], str]) -> None:
    torch = pytest.importorskip("torch")
    manifest, bucket = on_ceph
    dataset = ReleaseDataset(f"s3://{bucket}/{PREFIX}/demo-v1/manifest.json", storage={"ceph": ceph_s3.s3fs_kwargs()},
                             tier_preference=["ceph"], rank=0, world_size=1, shuffle=False)
    assert [s["sample_id"] for s in dataset] == all_ids(manifest)
    assert set(dataset.source.reads) == {("ceph", shard["name"]) for shard in manifest["shards"]}
    assert all(dataset.source.hashed[shard["name"]] == 1 for shard in manifest["shards"])  # verified on the way in
    # DataLoader workers forked after this process has used its s3fs filesystem open their own
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    assert sorted(s["sample_id"] for s in loader) == sorted(all_ids(manifest))  # each worker its own shards


def test_fails_over_from_corrupt_and_missing_cfs_replicas_to_ceph(
    tmp_path: Path, ceph_s3: S3Endpoint, on_ceph: tuple[dict[str, Any], str]
) -> None:
    manifest, bucket = on_ceph
    names = [shard["name"] for shard in manifest["shards"]]
    corrupt = tmp_path / "cfs" / names[0]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, wrong sha256
    corrupt.write_bytes(bytes(data))
    (tmp_path / "cfs" / names[1]).unlink()
    storage = storage_yaml(tmp_path, ceph_s3, bucket, {"file": credentials_file(tmp_path, ceph_s3)})
    dataset = ReleaseDataset(str(tmp_path / "manifest.json"), storage=storage, tier_preference=["cfs", "ceph"],
                             rank=0, world_size=1, seed=5)
    assert Counter(s["sample_id"] for s in dataset) == Counter(all_ids(manifest))
    assert dataset.source.failovers == Counter({"cfs": 2})
    assert dataset.source.reads == Counter({("cfs", names[0]): 1, ("ceph", names[0]): 1,
                                            ("ceph", names[1]): 1, ("cfs", names[2]): 1})


def test_storage_config_with_env_credentials_and_a_clear_error_without(
    tmp_path: Path, ceph_s3: S3Endpoint, on_ceph: tuple[dict[str, Any], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest, bucket = on_ceph
    path = storage_yaml(tmp_path, ceph_s3, bucket, {"key_env": "LOADER_TEST_S3_KEY", "secret_env": "LOADER_TEST_S3_SECRET"})
    manifest_uri = f"s3://{bucket}/{PREFIX}/demo-v1/manifest.json"
    with pytest.raises(SpecError, match=r"storage.yaml: tiers.ceph.credentials: set the environment variables LOADER_TEST_S3_KEY"):
        ReleaseDataset(str(tmp_path / "manifest.json"), storage=path, tier_preference=["ceph"], rank=0, world_size=1)
    # a tier the loader will not read needs no credentials
    cfs_only = ReleaseDataset(str(tmp_path / "manifest.json"), storage=path, tier_preference=["cfs"], rank=0, world_size=1)
    assert sorted(s["sample_id"] for s in cfs_only) == all_ids(manifest)
    monkeypatch.setenv("LOADER_TEST_S3_KEY", ceph_s3.key)
    monkeypatch.setenv("LOADER_TEST_S3_SECRET", ceph_s3.secret)
    config = load_storage_config(path)  # the object form works the same as the path
    dataset = ReleaseDataset(manifest_uri, storage=config, tier_preference=["ceph"], rank=0, world_size=1)
    assert sorted(s["sample_id"] for s in dataset) == all_ids(manifest)
    assert {tier for tier, _ in dataset.source.reads} == {"ceph"}


READ_IN_WORKERS = """
import json, os, sys
import torch
from datahub.loader.dataset import ReleaseDataset

uri, options = sys.argv[1], json.loads(sys.argv[2])
dataset = ReleaseDataset(uri, storage={"ceph": options}, tier_preference=["ceph"], rank=0, world_size=1,
                         batch_size=4, batch_format="arrow")
rows = sum(batch.num_rows for batch in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
print("rows", rows, flush=True)
"""


def test_workers_forked_after_a_manifest_read_from_ceph_print_no_session_errors(
    ceph_s3: S3Endpoint, on_ceph: tuple[dict[str, Any], str]
) -> None:
    """The README's usage: the manifest read from s3:// in the trainer, then DataLoader workers. s3fs's filesystem
    references itself, so the one that read the manifest was freed by the cyclic collector whenever it next ran:
    in forked workers, where its session finalizer closed the trainer's aiohttp client on the worker's own event
    loop and printed 'Task exception was never retrieved ... attached to a different loop' twice per worker."""
    import subprocess
    import sys

    from tests.pipeline.corpus import REPO

    pytest.importorskip("torch")
    manifest, bucket = on_ceph
    done = subprocess.run(
        [sys.executable, "-c", READ_IN_WORKERS, f"s3://{bucket}/{PREFIX}/demo-v1/manifest.json",
         json.dumps(ceph_s3.s3fs_kwargs())],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["rows", str(len(all_ids(manifest)))]
    assert "Task exception was never retrieved" not in done.stderr, done.stderr[-3000:]
    assert "attached to a different loop" not in done.stderr

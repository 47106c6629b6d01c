"""Token files copied by `datahub tier apply` to the real Ceph RGW and back: a CLI apply SIGKILLed after the second
token file landed on Ceph resumes without writing any object twice (versioned bucket), the manifest names Ceph only
once every file is verified there, and a copy from Ceph alone to a fresh cfs tier gives the loader every document."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from datahub.shards.token_manifest import read_lake_token_manifest
from datahub.storage import validate_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.export.test_token_tiering import _documents, _exported, _exported_lineage, _tier_apply

pytestmark = pytest.mark.ceph

PREFIX = "releases"


def test_token_copy_to_ceph_resumes_after_sigkill_and_copies_back_to_cfs(tmp_path: Path, ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("token-tiers")
    ceph_s3.filesystem().make_bucket_versioned(bucket)  # an object written twice would leave two versions
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    ceph: dict[str, Any] = {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": PREFIX,
                            "region": ceph_s3.region, "credentials": {"file": str(credentials)}}
    tiers = {"hot": {"kind": "cfs", "path": str(tmp_path / "hot")}, "ceph": ceph,
             "again": {"kind": "cfs", "path": str(tmp_path / "again")}}
    first, second = tmp_path / "hot-ceph.yaml", tmp_path / "ceph-again.yaml"
    first.write_text(yaml.safe_dump({"tiers": {"hot": tiers["hot"], "ceph": ceph}}))
    second.write_text(yaml.safe_dump({"tiers": {"ceph": ceph, "again": tiers["again"]}}))
    storage = validate_storage_config({"tiers": tiers}, source="storage.yaml")
    lake, tokens = _exported(tmp_path, validate_storage_config({"tiers": {"hot": tiers["hot"]}}, source=str(first)))
    folder = f"{bucket}/{PREFIX}/r/tokens-{tokens.tokenizer.sha256[:12]}"
    fs = ceph_s3.filesystem()

    killed = _tier_apply(tmp_path, first, "hot,ceph", kill_at="tier:after_token_file:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    fs.invalidate_cache()
    landed = {p.rsplit("/", 1)[-1] for p in fs.find(folder)}
    assert {f"{r.prefix}.{p}" for r in tokens.files[:2] for p in ("bin", "idx", "ids")} <= landed
    assert "tokens-manifest.json" not in landed and read_lake_token_manifest(lake, "r") == tokens

    resumed = _tier_apply(tmp_path, first, "hot,ceph")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    moves = json.loads(resumed.stdout)["moves"]
    assert [(m["action"], m["tier"], m["shards"], m["token_files"]) for m in moves] == [
        ("copy", "ceph", 0, len(tokens.files))]  # the text shards were published on Ceph before the kill
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["ceph", "hot"]
    versioned = ceph_s3.filesystem(version_aware=True)
    for record in moved.files:  # verified at the destination, and nothing written twice
        for part in ("bin", "idx", "ids"):
            uri = f"{record.replicas['ceph']}.{part}"
            assert storage.tier("ceph").verify(uri, size=record.part(part).size, sha256=record.part(part).sha256)
            assert len(versioned.object_version_info(uri.removeprefix("s3://"))) == 1, uri
    assert len(_exported_lineage(lake, "ceph")) == tokens.num_documents

    # from Ceph alone (the second config has no "hot") to a fresh cfs tier, where the loader memory-maps them
    back = _tier_apply(tmp_path, second, "ceph,again")
    assert back.returncode == 0, back.stderr[-2000:]
    final = read_lake_token_manifest(lake, "r")
    assert final is not None and final.tiers == ["again", "ceph", "hot"]
    assert _documents(final, "again", tmp_path / "verdicts") == _documents(tokens, "hot", tmp_path / "verdicts")
    assert json.loads(_tier_apply(tmp_path, first, "hot,ceph").stdout)["moves"] == []

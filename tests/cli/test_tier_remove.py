"""`datahub tier remove --release R --reason TEXT`: the take-down from the command line (a cfs and a Ceph tier):
what it removed per tier (text and --json), the loader's refusal, an idempotent re-run, tier apply not bringing it
back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from datahub.loader.errors import ManifestError
from datahub.loader.manifest import load_manifest
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.cli.conftest import datahub
from datahub.storage import validate_storage_config
from tests.export.test_withdraw import REASON, _files, _on_two_tiers, _storage


def test_tier_remove_prints_what_it_removed_and_a_rerun_is_a_no_op(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    _on_two_tiers(tmp_path, storage)
    config = tmp_path / "storage.yaml"
    config.write_text(yaml.safe_dump({"tiers": {n: {"kind": "cfs", "path": str(tmp_path / n)} for n in ("hot", "cold")}}))
    args = ("tier", "remove", "--release", "r", "--reason", REASON, "--lake", str(tmp_path / "lake"),
            "--storage", str(config))

    out = datahub(*args)
    assert out.returncode == 0, out.stderr
    assert "r: withdrawn at" in out.stdout and REASON in out.stdout
    assert "hot: removed" in out.stdout and "cold: removed" in out.stdout and "total: removed" in out.stdout
    for tier in ("hot", "cold"):
        assert _files(tmp_path / tier / "r") == ["manifest.json"]
    with pytest.raises(ManifestError, match=REASON):
        load_manifest("r", lake=str(tmp_path / "lake"))

    again = datahub(*args, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["files"] == 0 and report["removed"] == {} and report["reason"] == REASON

    apply = datahub("tier", "apply", "--lake", str(tmp_path / "lake"), "--storage", str(config))
    assert apply.returncode == 0, apply.stderr
    placed = datahub("tier", "apply", "--lake", str(tmp_path / "lake"), "--storage", str(config), "--release", "r",
                     "--tiers", "hot,cold")
    assert placed.returncode != 0 and "withdrawn" in placed.stderr + placed.stdout
    for tier in ("hot", "cold"):
        assert _files(tmp_path / tier / "r") == ["manifest.json"]
    help_text = datahub("tier", "remove", "--help").stdout
    assert "Examples:" in help_text and "datahub tier remove --release corpus-v1" in help_text


@pytest.mark.ceph
def test_tier_remove_deletes_the_release_on_ceph(tmp_path: Path, ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("takedown")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    ceph: dict[str, Any] = {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket,
                            "prefix": "releases", "region": ceph_s3.region, "credentials": {"file": str(credentials)}}
    tiers = {"hot": {"kind": "cfs", "path": str(tmp_path / "hot")}, "cold": ceph}
    config = tmp_path / "storage.yaml"
    config.write_text(yaml.safe_dump({"tiers": tiers}))
    storage = validate_storage_config({"tiers": tiers}, source=str(config))
    _on_two_tiers(tmp_path, storage, check_local=False)
    fs = ceph_s3.filesystem()
    assert any(key.endswith(".tar") for key in fs.find(f"{bucket}/releases/r"))

    out = datahub("tier", "remove", "--release", "r", "--reason", REASON, "--lake", str(tmp_path / "lake"),
                  "--storage", str(config), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["removed"]["cold"]["files"] >= 6 and report["removed"]["hot"]["files"] >= 6
    fs.invalidate_cache()
    assert [k.rsplit("/", 1)[-1] for k in fs.find(f"{bucket}/releases/r")] == ["manifest.json"]
    assert b"withdrawn" in fs.cat_file(f"{bucket}/releases/r/manifest.json")
    again = json.loads(datahub("tier", "remove", "--release", "r", "--reason", REASON, "--lake",
                               str(tmp_path / "lake"), "--storage", str(config), "--json").stdout)
    assert again["removed"] == {}

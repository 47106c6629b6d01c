"""A token release moved across regions on the real Ceph RGW: `datahub tier apply --tiers ceph-eu` from a cfs tier in
us-east, SIGKILLed once in the copy and once in the removal, resumes to the release on Ceph alone (the us-east token
files gone only after the Ceph copies were verified); PackedDataset in eu-west then names the command that brings
the memory-mappable files to its region's cfs tier, and after it reads every token there. Token files exported to a
cfs tier beside a release on Ceph (a token-only replica) stay there."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from datahub.errors import SpecError
from datahub.export.tiering import plan_tiers
from datahub.shards.token_manifest import read_lake_token_manifest, read_tier_token_manifest, token_dir
from datahub.storage import load_storage_config
from tests.ceph import S3Endpoint, ceph_s3  # noqa: F401
from tests.export.test_token_removal import lake_tokens_path, packed_tokens, policy_apply, split_export, tier_files
from tests.export.test_token_tiering import PARTS, _exported, _tier_apply

pytestmark = pytest.mark.ceph


def _region_tokens(path: Path, storage: Path, region: str) -> tuple[Counter[int], set[str]]:
    """Every real token PackedDataset reads in ``region``, and the folders of the files it opened."""
    from datahub.loader.packing import PackedDataset

    dataset = PackedDataset(str(path), storage=storage, region=region, seq_len=16, batch_size=4, shuffle=False)
    seen: Counter[int] = Counter()
    for batch in dataset:
        seen.update(np.asarray(batch["tokens"])[np.asarray(batch["loss_mask"])].tolist())
    return seen, {str(Path(files.prefix).parents[2]) for files in dataset.files.files}


def test_a_release_moved_to_another_regions_ceph_leaves_no_token_files_behind(tmp_path: Path,
                                                                              ceph_s3: S3Endpoint) -> None:
    bucket = ceph_s3.new_bucket("token-regions")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    storage_yaml = tmp_path / "storage.yaml"
    storage_yaml.write_text(yaml.safe_dump({"tiers": {
        "home": {"kind": "cfs", "path": str(tmp_path / "home"), "region": "us-east"},
        "ceph-eu": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
                    "region": "eu-west", "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}},
        "eu": {"kind": "cfs", "path": str(tmp_path / "eu"), "region": "eu-west"}}}))
    storage = load_storage_config(storage_yaml)
    lake, tokens = _exported(tmp_path, storage, tier="home")
    path = lake_tokens_path(tmp_path, tokens)
    expected, folders = _region_tokens(path, storage_yaml, "eu-west")  # only us-east holds it yet
    assert folders == {str(tmp_path / "home")}

    for kill_at in ("tier:after_token_file:1", "tier:delete:after_text_manifest"):
        killed = _tier_apply(tmp_path, storage_yaml, "ceph-eu", kill_at=kill_at)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        named = read_lake_token_manifest(lake, "r")  # what it names on us-east is still there, whole
        assert named is not None
        assert all(Path(f"{record.replicas['home']}.{part}").stat().st_size == record.part(part).size
                   for record in named.files if "home" in record.replicas for part in PARTS)
    resumed = _tier_apply(tmp_path, storage_yaml, "ceph-eu")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["ceph-eu"] and not (tmp_path / "home" / "r").exists()
    ceph = storage.tier("ceph-eu")
    assert all(ceph.verify(f"{record.replicas['ceph-eu']}.{part}", size=record.part(part).size,
                           sha256=record.part(part).sha256) for record in moved.files for part in PARTS)

    # token files are memory-mapped: the loader in eu-west names the copy to its region's cfs tier
    with pytest.raises(SpecError) as error:
        _region_tokens(path, storage_yaml, "eu-west")
    assert "ceph-eu (eu-west)" in str(error.value) and "--release r --tiers ceph-eu,eu" in str(error.value)
    back = _tier_apply(tmp_path, storage_yaml, "ceph-eu,eu")
    assert back.returncode == 0, back.stderr[-2000:]
    assert _region_tokens(path, storage_yaml, "eu-west") == (expected, {str(tmp_path / "eu")})


def test_token_files_exported_to_cfs_stay_while_the_text_is_on_ceph(tmp_path: Path, ceph_s3: S3Endpoint) -> None:
    """The text on Ceph; token files exported on purpose to a cfs tier that never held it, so PackedDataset memory-maps
    them. `datahub tier apply` by the policy (every class on Ceph; no --tiers), twice: the token files are copied to
    Ceph (the release's placement) and kept on cfs, files and manifest; PackedDataset then reads every token from cfs.
    Before 06ccfe4, the first apply removed them from cfs as the leftover of a delete, and packed reads stopped until
    a cfs tier was added back. Then `--tiers ceph` (the whole placement) removes them from cfs, verified on Ceph."""
    bucket = ceph_s3.new_bucket("token-only")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={ceph_s3.secret}\n")
    storage_yaml = tmp_path / "storage.yaml"
    storage_yaml.write_text(yaml.safe_dump({"tiers": {
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
                 "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}},
        "packed": {"kind": "cfs", "path": str(tmp_path / "packed")}},
        "policy": {"classes": {"hot": ["ceph"], "warm": ["ceph"], "cold": ["ceph"]}}}))
    storage = load_storage_config(storage_yaml)
    lake, tokens = split_export(tmp_path, storage, text="ceph", tokens="packed")
    path = lake_tokens_path(tmp_path, tokens)
    expected = packed_tokens(path, ["packed"])
    before = tier_files(tmp_path / "packed")
    runs = [policy_apply(tmp_path, storage_yaml) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert [[(m["action"], m["tier"], m["token_files"]) for m in json.loads(run.stdout)["moves"]] for run in runs] == [
        [("copy", "ceph", len(tokens.files))], []]
    kept = read_lake_token_manifest(lake, "r")
    assert kept is not None and kept.tiers == ["ceph", "packed"]
    ceph = storage.tier("ceph")
    assert all(ceph.verify(f"{record.replicas['ceph']}.{part}", size=record.part(part).size,
                           sha256=record.part(part).sha256) for record in kept.files for part in PARTS)
    folder = f"r/{token_dir(tokens.tokenizer.sha256)}"
    assert {k: v for k, v in tier_files(tmp_path / "packed").items() if not k.startswith(f"{folder}/tokens-manifest")} \
        == {k: v for k, v in before.items() if not k.startswith(f"{folder}/tokens-manifest")}
    assert read_tier_token_manifest(storage.tier("packed"), "r", tokens.tokenizer.sha256) == kept
    assert packed_tokens(path, ["packed"]) == expected
    assert _region_tokens(path, storage_yaml, "")[0] == expected  # no preference: the only local replica, packed
    assert plan_tiers(lake, storage=storage, targets={"r": ["ceph"]}).moves == ()
    dropped = _tier_apply(tmp_path, storage_yaml, "ceph")
    assert dropped.returncode == 0, dropped.stderr[-2000:]
    assert [(m["action"], m["tier"], m["token_files"]) for m in json.loads(dropped.stdout)["moves"]] == [
        ("delete", "packed", len(tokens.files))]
    assert read_lake_token_manifest(lake, "r").tiers == ["ceph"] and not (tmp_path / "packed" / "r").exists()

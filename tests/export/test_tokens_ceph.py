"""Token export to the real Ceph RGW on Ray and Spark: the tokens are staged on S3 between the passes, the files are the
bytes of a local export, and the staging folder is gone afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from datahub.export.tokens import export_table_tokens
from datahub.storage import validate_storage_config
from tests.ceph import ceph_s3  # noqa: F401
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.export.test_tokens import make_lake, train_tokenizer

pytestmark = pytest.mark.ceph


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_engine_token_export_to_ceph_matches_a_local_export(tmp_path, ceph_s3, request, engine_name) -> None:
    """Ray with chunks of a few documents (a write task gathers a file chunk by chunk), Spark in its sorted batches:
    each task streams its file to a multipart upload."""
    engine = request.getfixturevalue(f"{engine_name}_engine")
    bucket = ceph_s3.new_bucket("token-export")
    credentials = tmp_path / "ceph.credentials"  # read by every Ray worker: engine tasks resolve the tier themselves
    credentials.write_text(f"access_key_id = {ceph_s3.key}\nsecret_access_key = {ceph_s3.secret}\n")
    storage = validate_storage_config({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
                 "region": ceph_s3.region, "credentials": {"file": str(credentials)}},
    }}, source="storage.yaml")
    lake, version = make_lake(tmp_path / "lake", 90)
    path = train_tokenizer(tmp_path / "tok.json")
    settings = {"file_tokens": 500, "shuffle_seed": 4}
    local = export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                                storage=storage, **settings)
    remote = export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="ceph",
                                 storage=storage, engine=engine, workers=2, chunk_bytes=300, **settings)
    assert len(remote.files) == len(local.files) > 2 and remote.tiers == ["ceph", "cfs"]
    fs = ceph_s3.filesystem()
    for record in remote.files:
        for suffix in ("bin", "idx", "ids"):
            assert fs.cat(record.replicas["ceph"] + "." + suffix) == Path(record.replicas["cfs"] + "." + suffix).read_bytes()
    folder = remote.files[0].replicas["ceph"].rsplit("/", 1)[0]
    assert fs.exists(f"{folder}/tokens-manifest.json") and not fs.exists(f"{folder}/_partial")


def test_tier_apply_keeps_token_only_files_on_ceph_and_moves_them_off_with_the_text(tmp_path, ceph_s3) -> None:
    """Token files exported to Ceph, the text on cfs: a token-only replica. A leftover delete on Ceph (S3: no
    directories, one listing) takes the stale text shard beside them and keeps the token files (copied to cfs, where
    the text is, too). Once the text is on Ceph as well and moves off it, the token files there go with it (verified
    on cfs first)."""
    from datahub.export import export_table_version, read_lake_manifest
    from datahub.export.tiering import apply_tiers, plan_tiers
    from datahub.shards.token_manifest import read_lake_token_manifest, token_dir

    bucket = ceph_s3.new_bucket("token-tiers")
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text(f"access_key_id = {ceph_s3.key}\nsecret_access_key = {ceph_s3.secret}\n")
    storage = validate_storage_config({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs")},
        "ceph": {"kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
                 "region": ceph_s3.region, "credentials": {"file": str(credentials)}},
    }}, source="storage.yaml")
    lake, version = make_lake(tmp_path / "lake", 60)
    export_table_version(lake, table="samples", version=version, release_name="r", tier="cfs", storage=storage,
                         shard_samples=30)
    tokens = export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                                 tokenizer=train_tokenizer(tmp_path / "tok.json"), tier="ceph", file_tokens=400)
    ceph = storage.tier("ceph")
    ceph.publish(ceph.uri("r", "r-000000.tar"), b"an old replica")
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cfs"]})
    assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [
        ("copy", "cfs", False, len(tokens.files)), ("delete", "ceph", True, 0)]
    assert len(apply_tiers(lake, plan, storage=storage)) == 2
    both = read_lake_token_manifest(lake, "r")
    assert both is not None and both.tiers == ["ceph", "cfs"]
    assert ceph.children(ceph.uri("r")) == [token_dir(tokens.tokenizer.sha256)]
    assert all(storage.tier(tier).verify(f"{uri}.{part}", size=record.part(part).size, sha256=record.part(part).sha256)
               for record in both.files for tier, uri in record.replicas.items() for part in ("bin", "idx", "ids"))
    assert read_lake_manifest(lake, "r").tiers == ["cfs"]
    assert plan_tiers(lake, storage=storage, targets={"r": ["cfs"]}).moves == ()
    # the text onto Ceph and off it again: the token files there leave with it
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["cfs", "ceph"]}), storage=storage)
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cfs"]})
    assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [
        ("delete", "ceph", False, len(tokens.files))]
    assert len(apply_tiers(lake, plan, storage=storage)) == 1
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["cfs"] and all(list(r.replicas) == ["cfs"] for r in moved.files)
    assert ceph.children(ceph.uri("r")) == []
    assert all(Path(f"{record.replicas['cfs']}.{part}").stat().st_size == record.part(part).size
               for record in moved.files for part in ("bin", "idx", "ids"))
    assert read_lake_manifest(lake, "r").tiers == ["cfs"]
    assert plan_tiers(lake, storage=storage, targets={"r": ["cfs"]}).moves == ()

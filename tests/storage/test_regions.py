"""Region labels on tiers: validated, shown by `datahub tier plan|apply`, used by the loader to pick replicas."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.loader.dataset import ReleaseDataset
from datahub.storage.config import validate_storage_config
from tests.export.helpers import make_lake


def test_region_label_on_every_tier_kind_and_the_s3_region(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    config = validate_storage_config({"tiers": {
        "cfs": {"kind": "cfs", "path": "/mnt/cfs", "region": "us-east"},
        "ceph": {"kind": "ceph", "endpoint_url": "http://rgw:7480", "bucket": "b"},
        "ceph-eu": {"kind": "ceph", "endpoint_url": "http://rgw-eu:7480", "bucket": "b", "region": "eu-west",
                    "s3_region": "default"},
        "hdfs": {"kind": "hdfs", "url": "webhdfs://nn:9870/x", "region": "us-east"}}})
    assert [config.tier(name).region for name in config.tiers] == ["us-east", None, "eu-west", "us-east"]
    s3_region = {name: config.tier(name).reader_options()["client_kwargs"]["region_name"]
                 for name in ("ceph", "ceph-eu")}
    assert s3_region == {"ceph": "us-east-1", "ceph-eu": "default"}  # unlabelled: as before; labelled: s3_region


def test_tier_plan_shows_regions_and_the_loader_reads_its_own_regions_copy(tmp_path: Path, monkeypatch) -> None:
    lake = str(tmp_path / "lake")
    make_lake(lake, 30)
    storage = tmp_path / "storage.yaml"
    storage.write_text(json.dumps({"tiers": {
        "cfs": {"kind": "cfs", "path": str(tmp_path / "cfs"), "region": "us-east"},
        "cfs-eu": {"kind": "cfs", "path": str(tmp_path / "eu"), "region": "eu-west"}}}))
    runner = CliRunner()
    exported = runner.invoke(app, ["export", "r1", "--lake", lake, "--tier", "cfs", "--storage", str(storage),
                                   "--table", "samples", "--shard-samples", "12"])
    assert exported.exit_code == 0, exported.output
    args = ["--lake", lake, "--storage", str(storage), "--release", "r1", "--tiers", "cfs,cfs-eu"]
    plan = runner.invoke(app, ["tier", "plan", *args])
    assert plan.exit_code == 0, plan.output
    assert "copy cfs (us-east) -> cfs-eu (eu-west)" in plan.stdout
    planned = json.loads(runner.invoke(app, ["tier", "plan", *args, "--json"]).stdout)
    assert planned["regions"] == {"cfs": "us-east", "cfs-eu": "eu-west"}
    applied = runner.invoke(app, ["tier", "apply", *args])
    assert applied.exit_code == 0, applied.output
    assert "cfs-eu (eu-west)" in applied.stdout

    monkeypatch.setenv("DATAHUB_REGION", "eu-west")
    for region, tier in ((None, "cfs-eu"), ("us-east", "cfs")):
        dataset = ReleaseDataset("r1", lake=lake, storage=storage, region=region, rank=0, world_size=1)
        assert len(list(dataset)) == 30
        assert {read_tier for read_tier, _ in dataset.source.reads} == {tier}

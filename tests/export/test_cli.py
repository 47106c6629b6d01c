"""`datahub export` and `datahub tier plan|apply` through the CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from datahub.cli.main import app
from tests.export.helpers import make_lake


def test_export_then_tier_plan_and_apply(tmp_path) -> None:
    make_lake(tmp_path / "lake", 40)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n"
                       f"  cfs2:\n    kind: cfs\n    path: {tmp_path / 'cfs2'}\n")
    runner = CliRunner()
    out = runner.invoke(app, ["export", "r1", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(storage),
                              "--table", "samples", "--shard-samples", "15", "--json"])
    assert out.exit_code == 0, out.output
    manifest = json.loads(out.stdout)
    assert [s["samples"] for s in manifest["shards"]] == [15, 15, 10]
    args = ["--lake", str(tmp_path / "lake"), "--storage", str(storage), "--release", "r1", "--tiers", "cfs2", "--json"]
    plan = json.loads(runner.invoke(app, ["tier", "plan", *args]).stdout)
    assert [(m["action"], m["tier"]) for m in plan["moves"]] == [("copy", "cfs2"), ("delete", "cfs")]
    assert plan["bytes_to_copy"] == sum(s["size"] for s in manifest["shards"])
    assert (tmp_path / "cfs/r1").exists()  # plan is a dry run
    assert runner.invoke(app, ["tier", "apply", *args]).exit_code == 0
    assert not (tmp_path / "cfs/r1").exists() and (tmp_path / "cfs2/r1/r1-000002.tar").exists()
    assert json.loads(runner.invoke(app, ["tier", "apply", *args]).stdout)["moves"] == []

    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers:\n  cfs:\n    kind: cfs\n    mount: /mnt/cfs\n")
    failed = runner.invoke(app, ["export", "r2", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(bad),
                                 "--table", "samples"])
    assert failed.exit_code != 0 and "tiers.cfs.cfs.path" in str(failed.exception)


def test_relative_cfs_path_resolves_against_the_working_directory(tmp_path, monkeypatch) -> None:
    """Like a job spec's lake root, a relative tier path is taken from the current directory."""
    from datahub.storage import load_storage_config

    storage = tmp_path / "storage.yaml"
    storage.write_text("tiers:\n  cfs:\n    kind: cfs\n    path: ./shards/hot\n")
    monkeypatch.chdir(tmp_path)
    assert load_storage_config(storage).tiers["cfs"].path == str(tmp_path / "shards" / "hot")

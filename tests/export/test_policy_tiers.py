"""Policy-driven `datahub tier plan|apply` (no --tiers) on real releases: channels, archive events, reads, age."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.export import read_lake_manifest
from datahub.export.tiering import apply_tiers, plan_tiers, release_states
from datahub.lake import Lake
from datahub.release.events import EVENTS_TABLE
from datahub.storage import load_storage_config
from tests.export.helpers import make_lake

STORAGE = """\
tiers:
  hot: {{kind: cfs, path: {root}/hot}}
  warm: {{kind: cfs, path: {root}/warm}}
  cold: {{kind: cfs, path: {root}/cold}}
policy:
  classes: {{hot: [hot, warm], warm: [warm], cold: [cold]}}
  hot_channels: [stable]
  hot_if_read_within_days: 14
  cold_if_unread_days: 90
"""


def _cli(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"datahub {' '.join(args)}:\n{result.output}\n{result.exception!r}"
    return result.stdout


def _moves(plan: dict) -> list[tuple[str, str, str, str]]:
    return sorted((m["release"], m["action"], m["tier"], m["storage_class"]) for m in plan["moves"])


def test_policy_places_stable_archived_read_and_idle_releases(tmp_path) -> None:
    make_lake(tmp_path / "lake", 30)
    root = str(tmp_path / "lake")
    storage = tmp_path / "storage.yaml"
    storage.write_text(STORAGE.format(root=tmp_path))
    runner = CliRunner()
    names = ["stable-r", "archived-r", "read-r", "idle-r"]
    for name in names:
        _cli(runner, "release", "create", name, "--lake", root)
        manifest = json.loads(_cli(runner, "export", name, "--lake", root, "--tier", "warm", "--storage", str(storage),
                                   "--shard-samples", "12", "--json"))
        assert [s["samples"] for s in manifest["shards"]] == [12, 12, 6]
    _cli(runner, "release", "promote", "stable-r", "--lake", root, "--channel", "stable")
    assert "archived-r archived" in _cli(runner, "release", "archive", "archived-r", "--lake", root, "--reason", "superseded")
    assert "already archived" in _cli(runner, "release", "archive", "archived-r", "--lake", root)
    assert "recorded" in _cli(runner, "tier", "touch", "read-r", "--lake", root, "--reader", "train-job-7")
    assert "already recorded today" in _cli(runner, "tier", "touch", "read-r", "--lake", root)
    events = Lake(root).read(EVENTS_TABLE).to_pylist()
    assert sorted((e["release"], e["event"]) for e in events) == [("archived-r", "archived"), ("read-r", "read")]
    assert [e["detail"] for e in events if e["event"] == "read"] == ["train-job-7"]

    args = ["--lake", root, "--storage", str(storage), "--json"]
    plan = json.loads(_cli(runner, "tier", "plan", *args))
    assert _moves(plan) == [
        ("archived-r", "copy", "cold", "cold"), ("archived-r", "delete", "warm", "cold"),
        ("read-r", "copy", "hot", "hot"),
        ("stable-r", "copy", "hot", "hot"),
    ]  # idle-r: released today, never read -> warm, where it already is
    sizes = {n: sum(s.size for s in read_lake_manifest(Lake(root), n).shards) for n in names}
    assert plan["bytes_to_copy"] == sizes["archived-r"] + sizes["read-r"] + sizes["stable-r"]
    assert (tmp_path / "warm/archived-r").exists() and not (tmp_path / "hot").exists()  # plan is a dry run

    assert _moves(json.loads(_cli(runner, "tier", "apply", *args))) == _moves(plan)
    lake = Lake(root)
    tiers = {n: read_lake_manifest(lake, n).tiers for n in names}
    assert tiers == {"stable-r": ["hot", "warm"], "archived-r": ["cold"], "read-r": ["hot", "warm"], "idle-r": ["warm"]}
    assert not (tmp_path / "warm/archived-r").exists() and (tmp_path / "cold/archived-r/archived-r-000002.tar").exists()
    assert (tmp_path / "hot/stable-r/stable-r-000000.tar").read_bytes() == (tmp_path / "warm/stable-r/stable-r-000000.tar").read_bytes()
    assert json.loads(_cli(runner, "tier", "apply", *args))["moves"] == []  # applying twice is a no-op

    # 120 days on: the read is old and idle-r was never read -> cold; stable-r stays hot by its channel
    config = load_storage_config(storage)
    later = datetime.now(timezone.utc) + timedelta(days=120)
    states = release_states(lake, names)
    assert states["read-r"].last_read is not None and states["idle-r"].last_read is None
    assert states["idle-r"].created is not None and states["stable-r"].channels == ("stable",)
    future = plan_tiers(lake, storage=config, now=later)
    assert sorted((m.release, m.action, m.tier, m.storage_class) for m in future.moves) == [
        ("idle-r", "copy", "cold", "cold"), ("idle-r", "delete", "warm", "cold"),
        ("read-r", "copy", "cold", "cold"), ("read-r", "delete", "hot", "cold"), ("read-r", "delete", "warm", "cold"),
    ]
    apply_tiers(lake, future, storage=config)
    assert read_lake_manifest(lake, "read-r").tiers == ["cold"] and read_lake_manifest(lake, "idle-r").tiers == ["cold"]
    exported = [json.loads(r["ref"])["tier"] for r in lake.read("lineage").to_pylist() if r["action"] == "exported"
                and r["run_id"].startswith("export/read-r/")]
    assert sorted(set(exported)) == ["cold", "hot", "warm"] and len(exported) == 3 * 30

    # un-archiving puts archived-r back by the policy (warm: released today, unread)
    assert "archived-r unarchived" in _cli(runner, "release", "archive", "archived-r", "--lake", root, "--undo")
    back = json.loads(_cli(runner, "tier", "plan", *args, "--release", "archived-r"))
    assert _moves(back) == [("archived-r", "copy", "warm", "warm"), ("archived-r", "delete", "cold", "warm")]


def test_archive_and_touch_refuse_unknown_releases(tmp_path) -> None:
    make_lake(tmp_path / "lake", 5)
    runner = CliRunner()
    for args in (["release", "archive", "nope"], ["tier", "touch", "nope"]):
        result = runner.invoke(app, [*args, "--lake", str(tmp_path / "lake")])
        assert result.exit_code != 0 and "no release 'nope'" in str(result.exception)


def test_tier_plan_verify_reads_under_the_bandwidth_cap(tmp_path, monkeypatch) -> None:
    """`tier plan --verify --max-mb-s` hashes every kept replica under the cap, as apply does."""
    from datahub.storage.bandwidth import BandwidthCap

    make_lake(tmp_path / "lake", 30)
    root = str(tmp_path / "lake")
    storage = tmp_path / "storage.yaml"
    storage.write_text(STORAGE.format(root=tmp_path))
    runner = CliRunner()
    _cli(runner, "release", "create", "r", "--lake", root)
    manifest = json.loads(_cli(runner, "export", "r", "--lake", root, "--tier", "warm", "--storage", str(storage),
                               "--shard-samples", "12", "--json"))
    taken: list[int] = []
    real_take = BandwidthCap.take
    monkeypatch.setattr(BandwidthCap, "take", lambda self, size: (taken.append(size), real_take(self, size))[1])
    plan = json.loads(_cli(runner, "tier", "plan", "--lake", root, "--storage", str(storage), "--release", "r",
                           "--tiers", "warm", "--verify", "--max-mb-s", "1000000", "--json"))
    assert plan["moves"] == []
    assert sum(taken) == sum(s["size"] for s in manifest["shards"])  # every kept replica hashed under the cap
    taken.clear()
    _cli(runner, "tier", "plan", "--lake", root, "--storage", str(storage), "--release", "r", "--tiers", "warm",
         "--verify", "--json")
    assert taken == []  # no cap asked: none charged


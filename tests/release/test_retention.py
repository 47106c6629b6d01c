"""A release stays readable by time travel through checkpoints and log cleanup; only an explicit
``release vacuum`` removes data, and only of releases it is told to drop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import create_release, release_digest, vacuum
from tests.release.helpers import sample_rows

# checkpoint every 2 commits, logs expire at once: deltalake's post-commit cleanup is eligible
TINY_RETENTION = {"delta.checkpointInterval": "2", "delta.logRetentionDuration": "interval 0 seconds"}


def _other_writer_lake(tmp_path) -> Lake:
    """A samples table created by a writer other than Lake.commit (Spark add-actions, an older datahub)."""
    lake = Lake(tmp_path / "lake")
    rows = sample_rows([f"first doc {i}" for i in range(4)], "a.jsonl")
    write_deltalake(lake.table_uri("samples"), rows, configuration=TINY_RETENTION)
    return lake


def _rewrite(lake: Lake, generations: int) -> None:
    for g in range(generations):
        rows = sample_rows([f"generation {g} doc {i}" for i in range(3)], "b.jsonl")
        write_deltalake(lake.table_uri("samples"), rows, mode="overwrite")  # default post-commit hook


def test_release_survives_checkpoints_and_expired_log_cleanup(tmp_path):
    lake = _other_writer_lake(tmp_path)
    release = create_release(lake, "r1")
    assert lake.table("samples").metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    _rewrite(lake, 7)
    log = sorted(p.name for p in Path(lake.table_uri("samples"), "_delta_log").iterdir())
    assert sum(name.endswith(".checkpoint.parquet") for name in log) >= 3
    assert "00000000000000000000.json" in log
    rows = lake.read(release.table, version=release.version)
    assert rows.num_rows == 4 and release_digest(rows.column("sample_id")) == release.digest


def test_vacuum_keeps_releases_unless_dropped(tmp_path):
    lake = _other_writer_lake(tmp_path)
    r1 = create_release(lake, "r1")
    _rewrite(lake, 3)
    r2 = create_release(lake, "r2")
    _rewrite(lake, 3)
    middle = r1.version + 2  # an overwrite between the releases, protected by neither

    with pytest.raises(ReleaseError, match="--force"):
        vacuum(lake, "samples", retention_hours=0)
    with pytest.raises(ReleaseError, match="no such release"):
        vacuum(lake, "samples", retention_hours=0, force=True, drop_releases=["r9"])
    dry = vacuum(lake, "samples", retention_hours=0, force=True)
    assert not dry.applied and dry.kept_releases == {"r1": r1.version, "r2": r2.version}
    assert len(dry.files) == 4 and dry.unreadable_releases == []  # 3 + 3 rewrites, minus r2's and the latest
    assert lake.read("samples", version=middle).num_rows == 3  # a dry run deletes nothing

    done = vacuum(lake, "samples", retention_hours=0, force=True, apply=True)
    assert done.applied and done.files == dry.files
    with pytest.raises(Exception, match="not found"):
        lake.read("samples", version=middle)
    for release in (r1, r2):
        rows = lake.read(release.table, version=release.version)
        assert release_digest(rows.column("sample_id")) == release.digest

    # a take-down: r1's data may go; r2 stays readable
    runner = CliRunner()
    out = runner.invoke(app, ["release", "vacuum", "--lake", lake.root, "--retention-hours", "0", "--force",
                              "--drop-release", "r1", "--apply", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["unreadable_releases"] == ["r1"] and report["kept_releases"] == {"r2": r2.version}
    with pytest.raises(Exception, match="not found"):
        lake.read(r1.table, version=r1.version)
    assert lake.read(r2.table, version=r2.version).num_rows == 3

"""`datahub release create` says how many taken-down samples it left out, and by which redacts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.lake import Lake
from datahub.release import create_release, redact
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


def test_release_create_names_what_earlier_redacts_left_out(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["keep me", "private phone number 555"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    redact(lake, "r1-r", source="r1", sample_ids=[sample_id_of("private phone number 555")], reason="PII")
    runner = CliRunner()
    out = runner.invoke(app, ["release", "create", "r2", "--lake", str(tmp_path / "lake")])
    assert out.exit_code == 0, out.output
    assert "left out 1 samples taken down by earlier redacts (r1-r)" in " ".join(out.output.split())
    shown = json.loads(runner.invoke(app, ["release", "show", "r2", "--lake", str(tmp_path / "lake"), "--json"]).output)
    assert shown["row_count"] == 1

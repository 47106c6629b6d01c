"""`datahub runs`: succeeded and failed runs with counts; a failed run says how to resume."""

from __future__ import annotations

import json

import pytest

from datahub.cli.commands.runs import list_runs
from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import job_raw, make_corpus, run_cli


def test_failed_run_then_resumed(tmp_path, ray_engine, monkeypatch):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=4)
    lake_root = tmp_path / "lake"
    spec = validate_job_spec(job_raw(corpus, lake_root))
    real_commit = Lake.commit

    def failing_commit(self, name, data, **kwargs):
        if name == "lineage":
            raise ValueError("disk quota exceeded while writing lineage")
        return real_commit(self, name, data, **kwargs)

    monkeypatch.setattr(Lake, "commit", failing_commit)
    with pytest.raises(ValueError):
        run_job(spec, engine=ray_engine)
    monkeypatch.setattr(Lake, "commit", real_commit)
    failed = list_runs(str(lake_root))
    assert [r["status"] for r in failed] == ["failed"]
    assert "disk quota exceeded" in failed[0]["error"] and "re-run" in failed[0]["hint"]

    resumed = run_job(spec, engine=ray_engine)
    assert resumed.status == "succeeded" and resumed.run_id == failed[0]["run_id"]
    listed = run_cli(["runs", str(lake_root), "--json", "--job", "crashjob"])
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)
    assert [i["status"] for i in items] == ["failed (resumed)", "succeeded"]
    assert items[1]["samples_written"] == 5 and items[1]["quarantined"] == 1 and items[1]["duration_s"] > 0
    assert json.loads(run_cli(["runs", str(lake_root), "--json", "--job", "nope"]).stdout) == []
    text = run_cli(["runs", str(lake_root)], env={"COLUMNS": "200"})
    assert text.returncode == 0 and "crashjob" in text.stdout and "failed (resumed)" in text.stdout

"""SIGKILL a real `datahub run` at each commit boundary, re-run it, compare with an uninterrupted run."""

from __future__ import annotations

import os
import signal

import pytest

from datahub.cli.commands.runs import list_runs
from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.faults import KILL_AT_ENV
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import data_commits, job_raw, make_corpus, run_cli, snapshot, write_job, write_jsonl, docs

KILL_POINTS = [
    "streaming",  # ingest and batch operators are mid-stream, nothing staged completely
    "after_node:normalize",
    "after_graph",  # everything staged locally, nothing committed
    "after_commit:samples",  # samples committed, quarantine/lineage/runs not
    "after_commit:quarantine",
    "after_commit:lineage",
    "before_commit:runs",
    "after_commit:runs",  # done, only the lease is left behind
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def clean(corpus, tmp_path_factory, ray_engine):
    """The lake after one uninterrupted run."""
    lake_root = tmp_path_factory.mktemp("clean") / "lake"
    result = run_job(validate_job_spec(job_raw(corpus, lake_root)), engine=ray_engine)
    assert result.status == "succeeded"
    return snapshot(Lake(lake_root)), result.run_id


def _ray_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_then_rerun_matches_clean_run(point, corpus, clean, tmp_path, ray_engine):
    clean_state, clean_run_id = clean
    lake_root = tmp_path / "lake"
    job = write_job(tmp_path / "job.yaml", job_raw(corpus, lake_root))
    killed = run_cli(["run", str(job), "--set", f"engine.address={_ray_address()}"], env={KILL_AT_ENV: point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    lake = Lake(lake_root)
    assert os.path.exists(lake_root / "_leases" / "crashjob.json"), "a killed run leaves its lease"

    listed = list_runs(str(lake_root))
    if point != "after_commit:runs":
        interrupted = [r for r in listed if r["status"] == "interrupted"]
        assert len(interrupted) == 1 and interrupted[0]["run_id"] == clean_run_id
        assert f"re-run with: datahub run {job} --lake {lake_root}" in interrupted[0]["hint"]
        assert not lake.applied("runs", clean_run_id)

    result = run_job(validate_job_spec(job_raw(corpus, lake_root)), engine=ray_engine, source=str(job))
    assert result.status == ("skipped" if point == "after_commit:runs" else "succeeded")
    assert result.run_id == clean_run_id or point == "after_commit:runs"

    state = snapshot(lake)
    assert len(set(state["sample_ids"])) == len(state["sample_ids"]), "duplicate samples"
    assert state == clean_state
    for table in ("samples", "quarantine", "lineage", "runs"):
        assert data_commits(lake, table) == [clean_run_id], f"{table}: one data commit per run"
    assert not os.path.exists(lake_root / "_leases" / "crashjob.json"), "the re-run releases the lease"
    assert [r["status"] for r in list_runs(str(lake_root))] == ["succeeded"]


@pytest.mark.parametrize("point", ["after_commit:lineage"])
def test_kill_during_incremental_run(point, tmp_path, ray_engine):
    """Second run with one new file, killed, re-run: same lake as two clean runs."""
    corpus_dir = make_corpus(tmp_path / "corpus", files=2, per_file=10)
    clean_root, crash_root = tmp_path / "clean", tmp_path / "crash"
    for root in (clean_root, crash_root):
        assert run_job(validate_job_spec(job_raw(corpus_dir, root)), engine=ray_engine).status == "succeeded"
    write_jsonl(corpus_dir / "part-new.jsonl", docs("new", 10))
    second = run_job(validate_job_spec(job_raw(corpus_dir, clean_root)), engine=ray_engine)
    assert second.inputs == [str(corpus_dir / "part-new.jsonl")]

    job = write_job(tmp_path / "job.yaml", job_raw(corpus_dir, crash_root))
    killed = run_cli(["run", str(job), "--set", f"engine.address={_ray_address()}"], env={KILL_AT_ENV: point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = run_job(validate_job_spec(job_raw(corpus_dir, crash_root)), engine=ray_engine)
    assert resumed.run_id == second.run_id and resumed.status == "succeeded"
    assert snapshot(Lake(crash_root)) == snapshot(Lake(clean_root))

"""`datahub runs`: succeeded and failed runs with counts; a failed run says how to resume."""

from __future__ import annotations

import json

import pytest

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake, add_actions
from datahub.pipeline.history import list_runs
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import job_raw, make_corpus, run_cli


def test_failed_run_then_resumed(tmp_path, ray_engine, monkeypatch):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=4)
    lake_root = tmp_path / "lake"
    spec = validate_job_spec(job_raw(corpus, lake_root))
    real_commit = add_actions.commit_files  # the run's files are committed as add actions

    def failing_commit(lake, name, files, **kwargs):
        if name == "lineage":
            raise ValueError("disk quota exceeded while writing lineage")
        return real_commit(lake, name, files, **kwargs)

    monkeypatch.setattr(add_actions, "commit_files", failing_commit)
    with pytest.raises(ValueError):
        run_job(spec, engine=ray_engine)
    monkeypatch.setattr(add_actions, "commit_files", real_commit)
    failed = list_runs(Lake(lake_root))
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


def _ray_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def test_failed_cli_run_text_shows_status_error_and_the_exact_resume_command(tmp_path, ray_engine):
    """A real failure (a quarantine table with a clashing column type, made by hand) after the
    samples commit; `datahub runs` prints how to resume; the printed command, run after the fix
    and after new input arrived, completes that run first and then ingests the new file."""
    import shutil

    import pyarrow as pa

    from datahub.lake.tables import QUARANTINE
    from tests.pipeline.corpus import docs, write_job, write_jsonl

    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=4)
    lake_root = tmp_path / "lake"
    job = write_job(tmp_path / "job.yaml", job_raw(corpus, lake_root))
    clashing = pa.schema([pa.field(f.name, pa.struct([("bytes", pa.int64())])) if f.name == "raw_size" else f
                          for f in QUARANTINE])
    Lake(lake_root).commit("quarantine", clashing.empty_table(), txn="hand-made")
    address = ["--set", f"engine.address={_ray_address()}"]
    failed = run_cli(["run", str(job), *address])
    assert failed.returncode != 0 and "do not fit the table's schema" in failed.stderr, failed.stderr[-2000:]

    text = run_cli(["runs", str(lake_root)], env={"COLUMNS": "160"})
    assert text.returncode == 0, text.stderr
    run_id = list_runs(Lake(lake_root))[0]["run_id"]
    lines = text.stdout.splitlines()
    detail = next(line for line in lines if line.startswith(f"{run_id} failed: "))
    assert "quarantine: the run's rows do not fit the table's schema" in detail
    assert "raw_size has incompatible types" in detail
    hint = lines[lines.index(detail) + 1]
    command = f"datahub run {job} --lake {lake_root}"
    assert hint == f"  fix the error above, then re-run (it completes this run first): {command}"
    row = Lake(lake_root).read("runs").to_pylist()[0]
    assert (row["job_spec"], row["full"]) == (str(job), False)

    shutil.rmtree(lake_root / "quarantine")  # the fix
    write_jsonl(corpus / "part-new.jsonl", docs("new", 3))
    resumed = run_cli([*command.split()[1:], *address, "--json"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout)
    assert result["resumed"]["run_id"] == run_id and result["inputs"] == [str(corpus / "part-new.jsonl")]
    samples = Lake(lake_root).read("samples")
    ids = samples.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 4 + 1 + 3  # no file of the failed run ingested twice
    assert sorted(set(samples.column("ingest_run_id").to_pylist())) == sorted([run_id, result["run_id"]])
    statuses = [(i["run_id"], i["status"]) for i in list_runs(Lake(lake_root))]
    assert statuses == [(run_id, "failed (resumed)"), (run_id, "succeeded"), (result["run_id"], "succeeded")]
    again = run_cli(["runs", str(lake_root)], env={"COLUMNS": "160"})
    assert "fix the error above" not in again.stdout and "failed (resumed)" in again.stdout


def test_the_resume_hint_of_an_interrupted_run_names_the_lake_yaml_runs_was_given(tmp_path):
    """Like a failed run's hint: a run killed on a lake opened with `--lake LAKE.yaml` is resumed with that YAML (it
    carries the storage options a bare root lacks), not the root its lease recorded."""
    import subprocess
    import sys

    lake_root, lake_file = tmp_path / "lake", tmp_path / "lake.yaml"
    lake_root.mkdir()
    lake_file.write_text(f"root: {lake_root}\n")
    killed = ("import os; from datahub.lake import Lake; from datahub.pipeline.lease import JobLease; "
              f"JobLease(Lake({str(lake_root)!r}), 'demo', source='/jobs/demo.yaml').acquire(); os._exit(9)")
    # the process exits holding the lease, as a killed run does
    assert subprocess.run([sys.executable, "-c", killed], check=False).returncode == 9
    listed = run_cli(["runs", "--lake", str(lake_file), "--json"])
    assert listed.returncode == 0, listed.stderr
    [item] = json.loads(listed.stdout)
    assert item["status"] == "interrupted"
    assert item["hint"] == f"interrupted, re-run with: datahub run /jobs/demo.yaml --lake {lake_file}"


def test_a_live_run_carrying_a_succeeded_runs_plan_is_listed_as_running(tmp_path):
    """A run that took over the lease of a run killed after its runs row carries that (succeeded) run's id until it
    writes its own plan; `runs` skipped every lease with a succeeded run id, so the live run was missing from the
    listing meanwhile. Only a stale such lease (the killed one: nothing to resume) is left out."""
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.lease import JobLease

    lake_root = tmp_path / "lake"
    spec = validate_job_spec(job_raw(make_corpus(tmp_path / "corpus", files=1, per_file=3), lake_root))
    done = run_job(spec, engine=ArrowEngine())
    lake = Lake(lake_root)
    live = JobLease(lake, "crashjob", ttl_s=3600).acquire()  # the taker, before it writes its own plan
    live.update(run_id=done.run_id, inputs=[])
    assert [r["status"] for r in list_runs(lake)] == ["succeeded", "running"]
    live.release()
    stale = JobLease(lake, "crashjob", ttl_s=0.01).acquire()
    stale.update(run_id=done.run_id, inputs=[])
    import time

    time.sleep(0.05)  # expired, never released: a killed holder whose run is recorded as succeeded
    assert [r["status"] for r in list_runs(lake)] == ["succeeded"]

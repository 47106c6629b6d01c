"""Incremental runs pick up only new or changed files; --full replaces this job's rows in one commit."""

from __future__ import annotations

import os

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.pipeline.corpus import data_commits, docs, job_raw, make_corpus, write_jsonl


def _ids(lake: Lake) -> list[str]:
    return sorted(lake.read("samples").column("sample_id").to_pylist())


def test_new_and_modified_files_only(tmp_path, ray_engine):
    corpus = make_corpus(tmp_path / "corpus", files=2, per_file=5)
    spec = validate_job_spec(job_raw(corpus, tmp_path / "lake"))
    lake = Lake(tmp_path / "lake")
    first = run_job(spec, engine=ray_engine)
    assert first.status == "succeeded" and len(first.inputs) == 3
    assert run_job(spec, engine=ray_engine).status == "skipped"

    write_jsonl(corpus / "part-9.jsonl", docs("late", 4))
    second = run_job(spec, engine=ray_engine)
    assert second.inputs == [str(corpus / "part-9.jsonl")] and second.counts["records_read"] == 4
    assert len(_ids(lake)) == 5 + 5 + 1 + 4

    changed = corpus / "part-0.jsonl"
    write_jsonl(changed, docs("f0", 5) + ["A brand new sixth document appended to part zero of the corpus."])
    os.utime(changed, (1_700_000_000, 1_700_000_000))  # identity = path + size + mtime
    third = run_job(spec, engine=ray_engine)
    assert third.inputs == [str(changed)]
    ids = _ids(lake)
    assert len(ids) == 15 + 6 and len(set(ids)) == 15 + 1, "re-ingested file: 5 old ids again + 1 new"
    assert len(lake.read("runs")) == 3
    assert len({first.run_id, second.run_id, third.run_id}) == 3


def test_full_replaces_this_jobs_rows_and_keeps_other_jobs(tmp_path, ray_engine):
    corpus_a = make_corpus(tmp_path / "a", files=2, per_file=5)
    corpus_b = tmp_path / "b"
    write_jsonl(corpus_b / "b.jsonl", docs("other job", 3))
    lake_root = tmp_path / "lake"
    job_a = validate_job_spec(job_raw(corpus_a, lake_root, name="job_a"))
    job_a_longer = validate_job_spec(job_raw(corpus_a, lake_root, name="job_a_x"))  # LIKE must not match it
    job_b = validate_job_spec(job_raw(corpus_b, lake_root, name="job-b"))
    lake = Lake(lake_root)
    first = run_job(job_a, engine=ray_engine)
    run_job(job_b, engine=ray_engine)
    run_job(job_a_longer, engine=ray_engine)
    before = lake.version("samples")
    before_rows = lake.read("samples").num_rows
    assert before_rows == 11 + 3 + 11

    full = run_job(job_a, full=True, engine=ray_engine)
    assert full.status == "succeeded" and len(full.inputs) == 3 and full.run_id != first.run_id
    samples = lake.read("samples")
    assert samples.num_rows == before_rows, "job_a's rows replaced, not appended"
    run_ids = samples.column("ingest_run_id").to_pylist()
    assert first.run_id not in run_ids and run_ids.count(full.run_id) == 11
    assert sum(r.startswith("job-b-") for r in run_ids) == 3 and sum(r.startswith("job_a_x-") for r in run_ids) == 11
    assert lake.version("samples") == before + 1 and data_commits(lake, "samples")[-1] == full.run_id
    old = lake.read("samples", version=before)  # time travel keeps the replaced version
    assert old.column("ingest_run_id").to_pylist().count(first.run_id) == 11
    quarantine = lake.read("quarantine").column("run_id").to_pylist()
    assert first.run_id not in quarantine and quarantine.count(full.run_id) == 1
    lineage = lake.read("lineage").column("run_id").to_pylist()
    assert first.run_id in lineage and full.run_id in lineage, "lineage is an event log: appended"
    assert run_job(job_a, engine=ray_engine).status == "skipped", "incremental after --full: nothing new"

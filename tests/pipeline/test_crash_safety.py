"""SIGKILL a real run at each commit boundary, re-run it, compare with an uninterrupted run.

Three jobs: the normalize-only job through `datahub run` on the session Ray; a dedup job
(exact_dedup + minhash_dedup + QA) in a subprocess on the in-process ArrowEngine (Ray's
shuffles cost seconds each on 2 cores), killed inside the dedup hooks and between every
commit, also with new input arriving between the kill and the re-run, and in a loop of
kills at successive points; and `datahub export`, killed between shards and before the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.errors import LakeError
from datahub.lake import Lake
from datahub.pipeline.faults import KILL_AT_ENV
from datahub.pipeline.history import list_runs
from datahub.pipeline.run import run_job
from datahub.qa import run_for_job
from tests.export.helpers import make_lake
from tests.operators.dedup.conftest import edit_words
from tests.operators.dedup.conftest import make_corpus as random_documents
from tests.pipeline.corpus import REPO, data_commits, job_raw, make_corpus, run_cli, snapshot, write_job, write_jsonl, docs

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

    listed = list_runs(Lake(lake_root))
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
    assert [r["status"] for r in list_runs(Lake(lake_root))] == ["succeeded"]


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


# --- the dedup job (ArrowEngine in a subprocess) -------------------------------------------

DEDUP_GRAPH = {
    "normalize": {"op": "normalize_text"},
    "exact": {"op": "exact_dedup", "after": ["normalize"]},
    "dedup": {"op": "minhash_dedup", "after": ["exact"], "params": {"threshold": 0.7, "verify": True}},
    "samples": {"sink": "samples", "after": ["dedup"]},
}
SIDE_TABLES = ("exact_index", "minhash_index", "qa_results")
DEDUP_KILL_POINTS = [  # in the order a run reaches them
    "exact_dedup:after_keepers",
    "minhash_dedup:after_signatures",
    "minhash_dedup:after_clustering",
    "after_commit:samples",
    "after_commit:lineage",
    "after_commit:exact_index",  # samples, quarantine and lineage committed; the dedup indexes not
    "after_commit:minhash_index",
    "before_commit:runs",  # qa_results committed too
]
# A script file, not `python -c`: pyspark.sql.connect (imported by great_expectations for the
# QA gate) calls sys.exit(0) when __main__ has no __file__, taking it for a doctest run.
ARROW_RUN = """import sys
from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.pipeline.run import run_job
from datahub.qa import run_for_job

print(run_job(load_job_spec(sys.argv[1]), engine=ArrowEngine(), source=sys.argv[1], qa_gate=run_for_job).status)
"""


def dedup_job(corpus: Path, lake: Path, *, qa: bool = True) -> dict[str, Any]:
    """``qa``: the QA gate (commits qa_results; costs a great_expectations import per process)."""
    return {"name": "dedupjob", "lake": {"root": str(lake)}, "inputs": [{"uri": f"{corpus}/*.jsonl"}],
            "graph": DEDUP_GRAPH, **({"qa": {"suites": ["samples.v1"]}} if qa else {})}


def write_dedup_corpus(directory: Path) -> Path:
    """Two files with near and exact duplicates across them, plus a broken record."""
    rng = random.Random(7)
    originals = random_documents(24, seed=7, words=80)
    near = [edit_words(originals[i], 0.01, rng) + " tail" for i in range(6)]
    exact = [originals[6].upper(), originals[7]]
    write_jsonl(directory / "a.jsonl", originals[:12] + near[3:])
    write_jsonl(directory / "b.jsonl", originals[12:] + near[:3] + exact)
    (directory / "broken.jsonl").write_text('{"text": "a short but fine record"}\n{not json\n')
    return directory


def write_new_input(directory: Path) -> None:
    """A file that arrives later: near and exact copies of ingested documents, and new ones."""
    rng = random.Random(8)
    originals = random_documents(24, seed=7, words=80)
    fresh = random_documents(5, seed=99, words=80)
    write_jsonl(directory / "c.jsonl", [edit_words(originals[i], 0.01, rng) for i in (8, 9)] + [originals[2]] + fresh)


def run_arrow(job: Path, kill_at: str) -> subprocess.CompletedProcess[str]:
    """The job in a fresh process on the ArrowEngine, killed at ``kill_at``."""
    script = job.parent / "run_arrow.py"
    script.write_text(ARROW_RUN)
    return subprocess.run([sys.executable, str(script), str(job)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, KILL_AT_ENV: kill_at, "PYTHONPATH": str(REPO)}, cwd=REPO, check=False)


def rerun(job: Path, corpus: Path, lake_root: Path, *, qa: bool = True):
    return run_job(validate_job_spec(dedup_job(corpus, lake_root, qa=qa)), engine=ArrowEngine(), source=str(job),
                   qa_gate=run_for_job)


def lake_state(lake: Lake) -> dict[str, Any]:
    """Everything that must match a clean lake: tables as multisets (timestamps aside), the runs
    rows (inputs, counts, table versions), and the run id of every data commit per table."""
    state = snapshot(lake)
    for table in ("exact_index", "minhash_index"):
        state[table] = Counter(tuple(r.values()) for r in lake.read(table).to_pylist())
    state["qa_results"] = sorted((r["run_id"], r["table"], r["table_version"], r["suite"], r["success"])
                                 for r in lake.read("qa_results").to_pylist())
    rows = []
    for r in lake.read("runs").to_pylist():
        counts = json.loads(r["counts"])
        counts.pop("duration_s")
        rows.append((r["run_id"], r["status"], r["full"], json.dumps(r["inputs"]), json.dumps(counts, sort_keys=True),
                     r["table_versions"]))
    state["runs_rows"] = sorted(rows)
    state["commits"] = {t: data_commits(lake, t) for t in ("samples", "quarantine", "lineage", "runs", *SIDE_TABLES)
                        if lake.exists(t)}
    return state


def assert_resumed_like_clean(lake_root: Path, clean_state: dict[str, Any], job: Path) -> None:
    state = lake_state(Lake(lake_root))
    assert len(set(state["sample_ids"])) == len(state["sample_ids"]), "duplicate samples"
    assert state == clean_state
    run_ids = {run_id for run_id, _ in state["runs"]}
    for table, txns in state["commits"].items():  # no orphan commits: every data commit is a finished run's
        assert all(txn in run_ids or txn.split("/")[1] in run_ids for txn in txns), (table, txns)
    assert {r["job_spec"] for r in Lake(lake_root).read("runs").to_pylist()} == {str(job)}
    assert not os.path.exists(lake_root / "_leases" / "dedupjob.json"), "the re-run releases the lease"


@pytest.fixture(scope="module")
def dedup_corpus(tmp_path_factory):
    return write_dedup_corpus(tmp_path_factory.mktemp("dedup-corpus"))


@pytest.fixture(scope="module")
def dedup_clean(dedup_corpus, tmp_path_factory):
    """The lake after one uninterrupted run of the dedup job."""
    root = tmp_path_factory.mktemp("dedup-clean")
    job = write_job(root / "job.yaml", dedup_job(dedup_corpus, root / "lake"))
    result = rerun(job, dedup_corpus, root / "lake")
    assert result.status == "succeeded", result.error
    dropped = json.loads(json.dumps(result.counts["dropped"]))
    assert dropped.get("exact_duplicate") and dropped.get("near_duplicate"), dropped  # both dedup stages bite
    return lake_state(Lake(root / "lake")), result.run_id


@pytest.mark.parametrize("point", DEDUP_KILL_POINTS)
def test_dedup_job_killed_then_rerun_matches_clean_run(point, dedup_corpus, dedup_clean, tmp_path):
    clean_state, clean_run_id = dedup_clean
    lake_root = tmp_path / "lake"
    job = write_job(tmp_path / "job.yaml", dedup_job(dedup_corpus, lake_root))
    killed = run_arrow(job, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    interrupted = [r for r in list_runs(Lake(lake_root)) if r["status"] == "interrupted"]
    assert [r["run_id"] for r in interrupted] == [clean_run_id]

    result = rerun(job, dedup_corpus, lake_root)
    assert (result.status, result.run_id, result.resumed) == ("succeeded", clean_run_id, None)
    assert None not in json.loads(Lake(lake_root).read("runs").column("table_versions")[0].as_py()).values()
    assert_resumed_like_clean(lake_root, clean_state, job)


@pytest.mark.parametrize("point", ["after_commit:samples", "after_commit:minhash_index", "after_commit:lineage@SIGINT"])
def test_new_input_between_kill_and_rerun(point, tmp_path):
    """The killed run is completed with its own files, then the new file runs next: same lake as two clean runs.

    Before the fix the re-run took old + new files under a new run id: the killed run's samples
    were ingested twice, its commits stayed as orphans, and (killed after minhash_index) its own
    index rows made its documents near duplicates of themselves. Ctrl-C (SIGINT) unwinds
    without a failed runs row: the lease is left behind expired, with the plan.
    """
    corpus = write_dedup_corpus(tmp_path / "corpus")
    clean_root, crash_root = tmp_path / "clean", tmp_path / "crash"
    clean_job = write_job(tmp_path / "clean.yaml", dedup_job(corpus, clean_root))
    job = write_job(tmp_path / "job.yaml", dedup_job(corpus, crash_root))
    first = rerun(clean_job, corpus, clean_root)
    killed = run_arrow(job, point)
    assert killed.returncode == -getattr(signal, point.partition("@")[2] or "SIGKILL"), killed.stderr[-2000:]
    assert [(r["run_id"], r["status"]) for r in list_runs(Lake(crash_root))] == [(first.run_id, "interrupted")]

    write_new_input(corpus)
    second = rerun(clean_job, corpus, clean_root)
    assert second.inputs == [str(corpus / "c.jsonl")] and second.counts["dropped_total"] >= 3
    result = rerun(job, corpus, crash_root)
    assert result.resumed is not None and result.resumed["run_id"] == first.run_id
    assert result.resumed["inputs"] == first.inputs and result.resumed["status"] == "succeeded"
    assert (result.run_id, result.inputs, result.status) == (second.run_id, second.inputs, "succeeded")
    clean_state = lake_state(Lake(clean_root))
    assert [r for r in clean_state["runs"]] == sorted([(first.run_id, "succeeded"), (second.run_id, "succeeded")])
    assert_resumed_like_clean(crash_root, clean_state, job)


@pytest.mark.parametrize("point, committed", [("exact_dedup:after_keepers", False), ("after_commit:samples", True)])
def test_spec_edited_between_kill_and_rerun(point, committed, dedup_corpus, tmp_path):
    """A run is completed with the spec it started with: an edit is refused while that run has commits,
    and a run that committed nothing is dropped in favour of the edited spec."""
    lake_root = tmp_path / "lake"
    job = write_job(tmp_path / "job.yaml", dedup_job(dedup_corpus, lake_root, qa=False))
    killed = run_arrow(job, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    edited = dedup_job(dedup_corpus, lake_root, qa=False)
    edited["graph"] = {**edited["graph"], "dedup": {**edited["graph"]["dedup"], "params": {"threshold": 0.9, "verify": True}}}
    spec = validate_job_spec(edited)
    if committed:
        with pytest.raises(LakeError, match="job spec changed since") as info:
            run_job(spec, engine=ArrowEngine(), source=str(job))
        assert "committed samples" in str(info.value) and "restore the spec it started with" in str(info.value)
        # the original spec still completes it
        result = rerun(job, dedup_corpus, lake_root, qa=False)
        assert result.status == "succeeded" and result.resumed is None
    else:
        result = run_job(spec, engine=ArrowEngine(), source=str(job))
        assert result.status == "succeeded" and result.resumed is None
        assert Lake(lake_root).read("runs").column("job_hash").to_pylist() == [spec.job_hash()]


def test_failed_run_leaves_its_plan_in_the_lease(corpus, tmp_path, ray_engine, monkeypatch, caplog):
    """An exception (not only a kill) leaves the lease behind, expired, with the plan: the failed
    runs row is not the only record (writing it may fail too when storage is down). The next run says
    which run it resumes, once it has decided (the lease alone may name a run that finished)."""
    import logging

    from datahub.pipeline.lease import read_lease

    lake_root = tmp_path / "lake"
    spec = validate_job_spec(job_raw(corpus, lake_root))
    real_commit = Lake.commit

    def failing_commit(self, name, data, **kwargs):
        if name in ("lineage", "runs"):  # the failed runs row cannot be written either
            raise OSError("Generic S3 error: Client error with status 403 Forbidden")
        return real_commit(self, name, data, **kwargs)

    monkeypatch.setattr(Lake, "commit", failing_commit)
    with pytest.raises(OSError):
        run_job(spec, engine=ray_engine)
    monkeypatch.setattr(Lake, "commit", real_commit)
    assert not Lake(lake_root).read("runs").num_rows
    lease = read_lease(Lake(lake_root), spec.name)
    assert lease is not None and lease.is_stale() and lease.job_hash == spec.job_hash()
    assert sorted(uri for uri, _, _ in lease.inputs) == sorted(str(p) for p in corpus.glob("*.jsonl"))
    assert [r["status"] for r in list_runs(Lake(lake_root))] == ["interrupted"]
    with caplog.at_level(logging.WARNING, logger="datahub.pipeline"):
        result = run_job(spec, engine=ray_engine)
    assert result.status == "succeeded" and result.run_id == lease.run_id
    assert read_lease(Lake(lake_root), spec.name) is None
    assert f"resuming run {lease.run_id} (" in caplog.text


# Successive invocations die at successive points; new input arrives after the third. `#N`:
# the N-th time one process reaches the point (the invocation that completes the first run
# goes on to the second run in the same process).
LOOP_POINTS = [
    "exact_dedup:after_keepers",  # first run, nothing committed
    "minhash_dedup:after_clustering",
    "after_commit:samples",  # first run's samples committed; now c.jsonl arrives
    "after_commit:quarantine",  # the first run, resumed
    "after_commit:exact_index",
    "before_commit:runs",
    "after_commit:samples#2",  # the first run completes, the second commits its samples and dies
    "minhash_dedup:after_signatures",  # the second run, resumed
    "after_commit:minhash_index",
    "after_commit:runs",  # done; only the lease is left
]


def test_kill_loop_at_successive_points_matches_clean_runs(tmp_path):
    """Without the QA gate (covered above): ten processes would import great_expectations."""
    corpus = write_dedup_corpus(tmp_path / "corpus")
    clean_root, crash_root = tmp_path / "clean", tmp_path / "crash"
    clean_job = write_job(tmp_path / "clean.yaml", dedup_job(corpus, clean_root, qa=False))
    job = write_job(tmp_path / "job.yaml", dedup_job(corpus, crash_root, qa=False))
    first = rerun(clean_job, corpus, clean_root, qa=False)
    for i, point in enumerate(LOOP_POINTS):
        killed = run_arrow(job, point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
        if i == 2:
            write_new_input(corpus)
            second = rerun(clean_job, corpus, clean_root, qa=False)
    last = rerun(job, corpus, crash_root, qa=False)
    assert last.status == "skipped"  # the killed invocations finished both runs between them
    clean_state = lake_state(Lake(clean_root))
    assert [run_id for run_id, _ in clean_state["runs"]] == sorted([first.run_id, second.run_id])
    assert_resumed_like_clean(crash_root, clean_state, job)


# --- export -----------------------------------------------------------------------------

EXPORT_KILL_POINTS = ["export:after_shard:0", "export:after_shard:2", "export:before_manifest", "export:after_tier_manifest"]


def _export(lake: Path, tier_dir: Path, *, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    storage = tier_dir.parent / f"{tier_dir.name}-storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tier_dir}\n")
    return run_cli(["export", "r1", "--lake", str(lake), "--tier", "cfs", "--storage", str(storage), "--table", "samples",
                    "--shard-samples", "25", "--json"], env={KILL_AT_ENV: kill_at} if kill_at else None)


def export_state(lake_root: Path, tier_dir: Path) -> dict[str, Any]:
    """Files on the tier (name -> sha256), the manifests without times and paths, the exported lineage.

    Every file counts, a CFS publish's temp file (``.NAME.partial-HEX``) too: one left by a shard
    that was uploading when the process died must be swept by the completing re-run.
    """
    files = {str(p.relative_to(tier_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(tier_dir.rglob("*")) if p.is_file()}
    lake = Lake(lake_root)
    lake_manifest = [p for p in lake_root.rglob("manifest.json")]
    manifests = []
    for path in [tier_dir / "r1" / "manifest.json", *lake_manifest]:
        manifest = json.loads(path.read_text())
        manifest.pop("created")
        manifests.append(json.dumps(manifest, sort_keys=True).replace(str(tier_dir), "TIER"))
    files.pop("r1/manifest.json")  # compared above, without its creation time
    lineage = lake.read("lineage").to_pylist()
    exported = Counter((r["sample_id"], r["run_id"], r["ref"].replace(str(tier_dir), "TIER")) for r in lineage
                       if r["action"] == "exported")
    return {"files": files, "manifests": manifests, "exported": exported, "commits": data_commits(lake, "lineage")}


@pytest.fixture(scope="module")
def export_clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-clean")
    make_lake(root / "lake", 120)
    done = _export(root / "lake", root / "tier")
    assert done.returncode == 0, done.stderr[-2000:]
    state = export_state(root / "lake", root / "tier")
    assert len([f for f in state["files"] if f.endswith(".tar")]) == 5 and sum(state["exported"].values()) == 120
    return state


@pytest.mark.parametrize("point", EXPORT_KILL_POINTS)
def test_export_killed_then_rerun_matches_clean_export(point, export_clean, tmp_path):
    make_lake(tmp_path / "lake", 120)
    killed = _export(tmp_path / "lake", tmp_path / "tier", kill_at=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not list((tmp_path / "lake").rglob("manifest.json")), "the lake's manifest marks a finished export"
    again = _export(tmp_path / "lake", tmp_path / "tier")
    assert again.returncode == 0, again.stderr[-2000:]
    assert export_state(tmp_path / "lake", tmp_path / "tier") == export_clean

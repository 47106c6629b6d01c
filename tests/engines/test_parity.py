"""The same job spec on Ray and on Spark: the same samples, decisions, lineage and run id."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake.lake import Lake
from datahub.pipeline.run import run_job
from datahub.qa import run_for_job
from operators.dedup.clustering import near_duplicate_clusters
from operators.dedup.minhash import MinHasher
from tests.operators.dedup.arrow_frame import ArrowFrame
from tests.operators.dedup.conftest import edit_words, make_corpus

REPO = Path(__file__).resolve().parents[2]
RUN_SPECIFIC = {"ts"}  # lineage/quarantine timestamps differ between any two runs


def _multiset(table: pa.Table) -> list[str]:
    keep = [c for c in table.column_names if c not in RUN_SPECIFIC]
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in table.select(keep).to_pylist())


def _run_both(job: str, tmp_path: Path, ray_engine, spark_engine, monkeypatch) -> tuple[Lake, Lake, dict]:
    monkeypatch.chdir(REPO)  # job specs name their inputs relative to the repo
    results = {}
    for name, engine in (("ray", ray_engine), ("spark", spark_engine)):
        spec = load_job_spec(REPO / job, [f"lake.root={tmp_path / name}", f"engine.kind={name}"])
        results[name] = run_job(spec, engine=engine, qa_gate=run_for_job)
        assert results[name].status == "succeeded", results[name].error
    return Lake(tmp_path / "ray"), Lake(tmp_path / "spark"), results


def _assert_same_lake(ray_lake: Lake, spark_lake: Lake, results: dict) -> None:
    assert results["ray"].run_id == results["spark"].run_id  # job hash + inputs: engine-independent
    assert results["ray"].counts == results["spark"].counts
    for table in ("samples", "quarantine", "lineage"):
        ray_rows, spark_rows = ray_lake.read(table), spark_lake.read(table)
        assert ray_rows.num_rows > 0
        assert set(ray_rows.column_names) == set(spark_rows.column_names), table
        assert _multiset(ray_rows) == _multiset(spark_rows.select(ray_rows.column_names)), table
    runs = {lake.read("runs").column("engine")[0].as_py(): lake.read("runs").column("run_id")[0].as_py() for lake in (ray_lake, spark_lake)}
    assert runs == {"ray": results["ray"].run_id, "spark": results["ray"].run_id}


def test_demo_job_is_identical_on_ray_and_spark(tmp_path, ray_engine, spark_engine, monkeypatch):
    ray_lake, spark_lake, results = _run_both("jobs/demo.yaml", tmp_path, ray_engine, spark_engine, monkeypatch)
    _assert_same_lake(ray_lake, spark_lake, results)
    samples = spark_lake.read("samples")
    assert samples.num_rows == results["spark"].counts["samples_written"]
    actions = set(spark_lake.read("lineage").column("action").to_pylist())
    assert {"ingested", "quarantined"} <= actions


def test_quality_job_with_struct_signals_and_drops_is_identical(tmp_path, ray_engine, spark_engine, monkeypatch):
    ray_lake, spark_lake, results = _run_both("jobs/quality-demo.yaml", tmp_path, ray_engine, spark_engine, monkeypatch)
    _assert_same_lake(ray_lake, spark_lake, results)
    quality = spark_lake.read("samples").schema.field("quality").type
    assert pa.types.is_struct(quality) and quality.num_fields > 3
    assert results["spark"].counts["dropped_total"] > 0  # the filters really decided something


def test_dedup_job_is_identical_on_ray_and_spark(tmp_path, ray_engine, spark_engine, monkeypatch):
    """Exact copies and near duplicates (1% of words edited: word 5-gram Jaccard about 0.9, over the
    0.8 threshold) decided the same way on Ray, on Spark and in the in-process reference engine."""
    corpus = tmp_path / "corpus.jsonl"
    originals = make_corpus(30, seed=3, words=200)
    rng = random.Random(4)
    docs = originals + [edit_words(t, 0.01, rng) for t in originals[:12]] + originals[:5]  # near + exact dups
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs) + "{a broken record\n")
    graph = {
        "exact": {"op": "exact_dedup"},
        "near": {"op": "minhash_dedup", "after": ["exact"]},  # threshold 0.8, no verify: LSH decides
        "samples": {"sink": "samples", "after": ["near"]},
    }
    spec_text = json.dumps({"name": "dedup-parity", "lake": {"root": "x"}, "inputs": [{"uri": str(corpus)}], "graph": graph})
    job = tmp_path / "dedup.yaml"
    job.write_text(spec_text)  # JSON is YAML
    ray_lake, spark_lake, results = _run_both(str(job), tmp_path, ray_engine, spark_engine, monkeypatch)
    _assert_same_lake(ray_lake, spark_lake, results)
    reference = run_job(load_job_spec(job, [f"lake.root={tmp_path / 'arrow'}"]), engine=ArrowEngine())
    for name, result in (*results.items(), ("arrow", reference)):
        dropped = result.counts["dropped"]
        assert dropped.get("exact_duplicate", 0) >= 5 and dropped.get("near_duplicate", 0) >= 5, (name, dropped)
        assert dropped == results["ray"].counts["dropped"], name
    for table in ("exact_index", "minhash_index"):  # what the next incremental run dedups against
        ray_rows, spark_rows = ray_lake.read(table), spark_lake.read(table)
        assert ray_rows.num_rows > 0, table
        assert _multiset(ray_rows) == _multiset(spark_rows.select(ray_rows.column_names)), table
    near = spark_lake.read("lineage").filter(pc.equal(spark_lake.read("lineage").column("reason"), "near_duplicate"))
    assert near.num_rows == results["spark"].counts["dropped"]["near_duplicate"]
    assert set(near.column("op").to_pylist()) == {"minhash_dedup@1"} and set(near.column("action").to_pylist()) == {"dropped"}


def test_near_duplicate_clusters_on_spark_match_the_arrow_reference(spark_engine):
    """The Frame-written global operator (LSH bands -> connected components -> keep rule) on Spark."""
    rng = random.Random(7)
    originals = make_corpus(40, seed=11)
    texts = originals + [edit_words(t, 0.02, rng) for t in originals[:15]] + originals[20:26]
    ids = [f"{i:04d}" for i in range(len(texts))]
    table = pa.table({"sample_id": ids, "text": texts})
    hasher = MinHasher(num_perm=64, seed=1)

    def decisions(frame):
        out = near_duplicate_clusters(frame, minhasher=hasher, bands=8, rows=8).to_arrow()
        return sorted(zip(out.column("sample_id").to_pylist(), out.column("keeper").to_pylist()))

    expected = decisions(ArrowFrame(table, batch_size=9))
    got = decisions(spark_engine.from_arrow(table))
    assert got == expected
    assert sum(1 for sample, keeper in got if sample != keeper) >= 15  # real duplicates were found

"""exact_dedup and minhash_dedup on inputs with nothing to remove, on Ray and on Spark.

No duplicates is the common case (an incremental run of new pages): the run must commit every
sample. Ray runs no batch function on an empty block, so a filter that keeps no row (no shared
key) used to lose its columns and the next join failed; these runs cover zero, one, all-duplicate
and duplicate-free inputs, an empty file among others, and an incremental second run, and check
that both engines commit the same tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from datahub.config.spec import validate_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.operators.dedup.conftest import make_corpus

OPS = {"exact_dedup": "exact_index", "minhash_dedup": "minhash_index"}
DISTINCT = make_corpus(6, seed=21)
LATER = make_corpus(3, seed=22)


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def run(op: str, inputs: Path, lake: Path, engine):
    spec = validate_job_spec({"name": "edge", "lake": {"root": str(lake)}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
                              "graph": {"dedup": {"op": op}, "samples": {"sink": "samples", "after": ["dedup"]}}},
                             source="jobs/edge.yaml")
    result = run_job(spec, engine=engine)
    assert result.status == "succeeded", result.error
    counts = result.counts
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    return result


def tables(lake: Path, index: str) -> dict[str, object]:
    """What a run leaves, engine-independent: sample ids, drop events, index rows."""
    db = Lake(lake)
    if not db.exists("samples"):  # no record at all: the run commits no table of rows
        return {"samples": [], "dropped": [], "index": [], "indexed": set()}
    lineage = db.read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    index_rows = db.read(index).drop_columns(["run_id"]).to_pylist() if db.exists(index) else []
    return {
        "samples": sorted(db.read("samples").column("sample_id").to_pylist()),
        "dropped": sorted((r["sample_id"], r["reason"], r["ref"]) for r in dropped.to_pylist()),
        "index": sorted(tuple(sorted(row.items())) for row in index_rows),
        "indexed": {row["sample_id"] for row in index_rows},
    }


def scenario(name: str, root: Path) -> tuple[list[list[str]], list[set[str]]]:
    """Input files per run and the sample ids each run must leave in ``samples``."""
    ids = {sample_id_of(t) for t in DISTINCT}
    if name == "zero":
        return [[]], [set()]
    if name == "one":
        return [[DISTINCT[0]]], [{sample_id_of(DISTINCT[0])}]
    if name == "all_duplicates":  # one text three times (one sample_id) and once in capitals (exact after normalization)
        text = DISTINCT[1]
        keeper = min(sample_id_of(text), sample_id_of(text.upper()))
        return [[text, text, text.upper()]], [{keeper}]
    if name == "no_duplicates":
        return [DISTINCT], [ids]
    if name == "incremental":  # a second run of new, distinct documents
        return [DISTINCT, LATER], [ids, ids | {sample_id_of(t) for t in LATER}]
    raise AssertionError(name)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("name", ["zero", "one", "all_duplicates", "no_duplicates", "incremental"])
def test_dedup_commits_every_sample_on_ray_and_spark(tmp_path, ray_engine, spark_engine, op, name):  # noqa: F811
    runs, expected = scenario(name, tmp_path)
    left: dict[str, dict[str, object]] = {}
    for engine_name, engine in (("ray", ray_engine), ("spark", spark_engine)):
        inputs, lake = tmp_path / engine_name / "in", tmp_path / engine_name / "lake"
        for number, (texts, want) in enumerate(zip(runs, expected)):
            write_jsonl(inputs / f"run{number}.jsonl", texts)
            if number == 0:
                write_jsonl(inputs / "empty.jsonl", [])  # an empty file: an empty batch among the others
            result = run(op, inputs, lake, engine)
            assert result.counts["records_read"] == len(texts)
            got = tables(lake, OPS[op])
            assert set(got["samples"]) == want, (engine_name, number)
            assert got["indexed"] == want  # every kept sample is in the index, so later runs see it
        left[engine_name] = tables(lake, OPS[op])
    assert left["ray"] == left["spark"]

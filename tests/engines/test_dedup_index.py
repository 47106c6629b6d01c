"""Incremental dedup reads the lake's indexes in engine tasks (``operators.dedup.index``): the same decisions on
the Arrow engine, Ray and Spark, whether the new keys go to the scan tasks or are hash-joined on the engine."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.operators.dedup.conftest import edit_words, make_corpus


def _rows(lake: Lake, table: str, drop: tuple[str, ...] = ()) -> list[str]:
    rows = lake.read(table)
    keep = [c for c in sorted(rows.column_names) if c not in drop]
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows.select(keep).to_pylist())


def test_incremental_decisions_are_the_same_on_every_engine_and_either_way_the_index_is_read(
        tmp_path, ray_engine, spark_engine, monkeypatch):
    """New keys up to ``BROADCAST_ROWS`` go to the scan tasks, which keep only matching rows; more are hash-joined
    with the scanned rows on the engine. Both, on Arrow, Ray and Spark: the same drops, samples and index rows."""
    import operators.dedup.index as index

    rng = random.Random(5)
    originals = make_corpus(20, seed=21)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in originals))
    fresh = make_corpus(4, seed=22)
    second = [edit_words(t, 0.02, rng) for t in originals[:4]] + originals[4:7] + fresh + [edit_words(fresh[0], 0.02, rng)]
    graph = {"exact": {"op": "exact_dedup"}, "near": {"op": "minhash_dedup", "after": ["exact"], "params": {"threshold": 0.5}},
             "samples": {"sink": "samples", "after": ["near"]}}

    def spec(root: Path):
        return validate_job_spec({"name": "idx", "lake": {"root": str(root)}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
                                  "graph": graph})

    assert run_job(spec(tmp_path / "first"), engine=ArrowEngine()).status == "succeeded"
    ids = {row["text"]: row["sample_id"] for row in Lake(tmp_path / "first").read("samples").to_pylist()}
    (inputs / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in second))
    outcomes = {}
    for name, engine in (("arrow", ArrowEngine(batch_size=4)), ("ray", ray_engine), ("spark", spark_engine)):
        for pushed in (True, False):
            monkeypatch.setattr(index, "BROADCAST_ROWS", index.BROADCAST_ROWS if pushed else 0)
            root = tmp_path / f"{name}-{pushed}"
            shutil.copytree(tmp_path / "first", root)
            result = run_job(spec(root), engine=engine)
            assert result.status == "succeeded", (name, pushed, result.error)
            lake = Lake(root)
            outcomes[name, pushed] = {"samples": _rows(lake, "samples", ("ts",)), "lineage": _rows(lake, "lineage", ("ts",)),
                                      "exact_index": _rows(lake, "exact_index"),
                                      "minhash_index": _rows(lake, "minhash_index"), "dropped": result.counts["dropped"]}
    reference = outcomes["arrow", True]
    assert sum(reference["dropped"].values()) == 8, reference["dropped"]  # 7 copies of lake samples, 1 of a new one
    lineage = [json.loads(r) for r in reference["lineage"]]
    dup_of = {json.loads(r["ref"])["dup_of"] for r in lineage if r["action"] == "dropped"}
    assert {ids[t] for t in originals[:7]} <= dup_of  # the lake's samples won
    for key, outcome in outcomes.items():
        assert outcome == reference, key

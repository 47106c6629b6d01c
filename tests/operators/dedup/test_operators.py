"""exact_dedup and minhash_dedup through run_job: real Delta lake, real operators.

The Ray tests use the shared session Ray (``ray_engine``); Ray's hash-shuffle joins cost
seconds each on 2 cores, so the broader behaviour (determinism, --full, verify, accuracy)
runs the same operators through ``run_job`` on the in-process ``ArrowEngine``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.compute as pc
import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.errors import SpecError
from datahub.lake import Lake
from datahub.pipeline.graph import build_graph
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of
from tests.operators.dedup.conftest import edit_words, make_corpus

GRAPH = {
    "exact": {"op": "exact_dedup"},
    "dedup": {"op": "minhash_dedup", "after": ["exact"], "params": {"threshold": 0.7}},
    "samples": {"sink": "samples", "after": ["dedup"]},
}


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def spec_for(inputs: Path, lake: Path, graph: dict | None = None, name: str = "dd"):
    return validate_job_spec({"name": name, "lake": {"root": str(lake)}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
                              "graph": graph or GRAPH}, source="jobs/x.yaml")


def drops(lake: Lake) -> dict[str, dict]:
    lineage = lake.read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    return {r["sample_id"]: {"reason": r["reason"], "op": r["op"], **json.loads(r["ref"])} for r in dropped.to_pylist()}


def kept(lake: Lake) -> set[str]:
    return set(lake.read("samples").column("sample_id").to_pylist())


def expected_kept(originals: list[str], near: list[str], exact_of: dict[int, str] | None = None) -> set[str]:
    """Keep rule without scores: the smallest sample_id of each {original i, copy} pair."""
    ids = {sample_id_of(t) for t in originals}
    for i, text in [*enumerate(near), *(exact_of or {}).items()]:
        pair = sorted([sample_id_of(originals[i]), sample_id_of(text)])
        ids.discard(pair[1])
        ids.add(pair[0])
    return ids


def dup_partner(originals: list[str], near: list[str], i: int) -> tuple[str, str]:
    """(dropped, kept) sample ids of pair i."""
    pair = sorted([sample_id_of(originals[i]), sample_id_of(near[i])])
    return pair[1], pair[0]


def corpus_with_dups(seed: int = 0):
    rng = random.Random(seed)
    originals = make_corpus(12, seed=seed)
    near = [edit_words(originals[i], 0.005, rng) + " tail" for i in range(4)]  # Jaccard ~0.9
    exact = [originals[5], originals[6].upper()]  # the second differs only in case: exact after normalization
    return originals, near, exact


def test_exact_and_near_duplicates_dropped_with_lineage_then_incremental_on_ray(tmp_path, ray_engine):
    originals, near, exact = corpus_with_dups()
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", originals[:8] + near[:2] + exact)
    write_jsonl(inputs / "b.jsonl", originals[8:] + near[2:] + [originals[7]])  # originals[7] twice: one sample_id
    lake = Lake(tmp_path / "lake")
    result = run_job(spec_for(inputs, tmp_path / "lake"), engine=ray_engine)
    assert result.status == "succeeded", result.error
    counts = result.counts
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]
    assert kept(lake) == expected_kept(originals, near, {6: exact[1]})
    d = drops(lake)
    for i in range(4):
        dropped, keeper = dup_partner(originals, near, i)
        ref = d[dropped]
        assert ref["reason"] == "near_duplicate" and ref["method"] == "minhash" and ref["op"] == "minhash_dedup@1"
        assert ref["dup_of"] == keeper and ref["cluster_id"] == min(keeper, dropped)
    lower, upper = sorted([sample_id_of(originals[6]), sample_id_of(exact[1])])
    assert d[upper]["reason"] == "exact_duplicate" and d[upper]["dup_of"] == lower and d[upper]["method"] == "exact"
    # originals[5] and originals[7] appear twice with one sample_id: exactly one row kept
    assert counts["samples_written"] == len(originals)
    index_rows = lake.read("minhash_index").num_rows
    bands = lake.read("minhash_index").group_by("sample_id").aggregate([("band_key", "count")])
    assert set(bands.column("sample_id").to_pylist()) == kept(lake)
    assert len(set(bands.column("band_key_count").to_pylist())) == 1  # one row per band, per kept sample

    # Incremental: a new file with a near-dup of an old sample and one new document.
    fresh = make_corpus(1, seed=99)[0]
    late = edit_words(originals[10], 0.005, random.Random(5)) + " tail"
    write_jsonl(inputs / "c.jsonl", [late, fresh])
    second = run_job(spec_for(inputs, tmp_path / "lake"), engine=ray_engine)
    assert second.status == "succeeded", second.error and second.counts["records_read"] == 2
    ref = drops(lake)[sample_id_of(late)]
    assert ref["dup_of"] == sample_id_of(originals[10]) and ref["reason"] == "near_duplicate" and ref.get("keeper_in_lake") is True
    assert sample_id_of(fresh) in kept(lake)
    index = lake.read("minhash_index")
    per_band = index_rows // len(originals)
    assert index.num_rows == index_rows + per_band  # appended: the new kept sample only, old rows untouched
    assert set(index.filter(pc.equal(index.column("run_id"), second.run_id)).column("sample_id").to_pylist()) == {
        sample_id_of(fresh)}


def test_two_runs_keep_the_same_samples(tmp_path):
    originals, near, exact = corpus_with_dups(seed=1)
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", near + originals + exact)
    first = run_job(spec_for(inputs, tmp_path / "l1"), engine=ArrowEngine(batch_size=5))
    second = run_job(spec_for(inputs, tmp_path / "l2"), engine=ArrowEngine(batch_size=3))
    assert first.status == second.status == "succeeded"
    assert kept(Lake(tmp_path / "l1")) == kept(Lake(tmp_path / "l2")) == expected_kept(originals, near, {6: exact[1]})
    assert drops(Lake(tmp_path / "l1")) == drops(Lake(tmp_path / "l2"))


def test_keep_by_missing_field_falls_back_to_smallest_sample_id(tmp_path):
    originals = make_corpus(2, seed=3)
    near = edit_words(originals[0], 0.005, random.Random(1)) + " tail"
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", [originals[0], near, originals[1]])
    # keep_by a field that is missing everywhere: null scores tie, smallest sample_id wins.
    graph = {"dedup": {"op": "minhash_dedup", "params": {"threshold": 0.6, "keep_by": "missing"}},
             "samples": {"sink": "samples", "after": ["dedup"]}}
    run_job(spec_for(inputs, tmp_path / "lake", graph), engine=ArrowEngine())
    pair = sorted([sample_id_of(originals[0]), sample_id_of(near)])
    assert pair[0] in kept(Lake(tmp_path / "lake")) and pair[1] not in kept(Lake(tmp_path / "lake"))


def test_full_run_ignores_own_rows_and_does_not_repeat_index_rows(tmp_path):
    originals, near, _ = corpus_with_dups(seed=2)
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", originals + near)
    spec = spec_for(inputs, tmp_path / "lake")
    lake = Lake(tmp_path / "lake")
    run_job(spec, engine=ArrowEngine())
    before = lake.read("minhash_index").num_rows
    exact_before = lake.read("exact_index").num_rows
    full = run_job(spec, full=True, engine=ArrowEngine())
    assert full.status == "succeeded", full.error
    # Against its own old rows everything would be a duplicate; --full dedups as the first run did.
    assert kept(lake) == expected_kept(originals, near)
    assert lake.read("samples").num_rows == len(originals)
    assert lake.read("minhash_index").num_rows == before and lake.read("exact_index").num_rows == exact_before


def test_verify_removes_chained_false_positives(tmp_path):
    # A chain: each document shares half its words with the next, so LSH at a low
    # threshold links neighbours while far ends are unrelated.
    rng = random.Random(7)
    words = [f"t{i}" for i in range(4000)]
    chain = []
    base = rng.sample(words, 60)
    for _ in range(8):
        chain.append(" ".join(base))
        base = base[30:] + rng.sample(words, 30)
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", chain)
    outcome = {}
    for verify in (False, True):
        graph = {"dedup": {"op": "minhash_dedup", "params": {"threshold": 0.9, "bands": 32, "rows": 1, "num_perm": 32,
                                                              "verify": verify, "shingle": "word", "ngram": 1}},
                 "samples": {"sink": "samples", "after": ["dedup"]}}
        lake_root = tmp_path / f"lake-{verify}"
        run_job(spec_for(inputs, lake_root, graph), engine=ArrowEngine())
        outcome[verify] = (kept(Lake(lake_root)), drops(Lake(lake_root)))
    assert len(outcome[False][0]) < len(chain)  # unverified: chained candidates merged, samples lost
    assert outcome[True][0] == {sample_id_of(t) for t in chain}  # nothing here has Jaccard >= 0.9


def test_verified_dedup_accuracy_on_planted_near_duplicates(tmp_path):
    from operators.dedup.minhash import MinHasher
    from operators.dedup.normalize import normalize_texts
    from operators.dedup.verify import jaccard_pairs

    rng = random.Random(11)
    originals = make_corpus(60, seed=11, words=150)
    planted = [edit_words(originals[i % 60], rng.choice([0.01, 0.03, 0.06, 0.3]), rng) for i in range(60)]
    texts = originals + planted
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a.jsonl", texts)
    threshold = 0.7
    graph = {"dedup": {"op": "minhash_dedup", "params": {"threshold": threshold, "verify": True}},
             "samples": {"sink": "samples", "after": ["dedup"]}}
    run_job(spec_for(inputs, tmp_path / "lake", graph), engine=ArrowEngine())
    d = drops(Lake(tmp_path / "lake"))
    # Truth: planted copies whose exact Jaccard to their original is >= threshold.
    import pyarrow as pa

    shingler = MinHasher().shingler
    left, lo = shingler(normalize_texts(pa.array(planted)))
    right, ro = shingler(normalize_texts(pa.array([originals[i % 60] for i in range(60)])))
    similarity = jaccard_pairs(left, lo, right, ro)
    truth = {frozenset((sample_id_of(planted[i]), sample_id_of(originals[i % 60]))) for i in range(60)
             if similarity[i] >= threshold and planted[i] != originals[i % 60]}
    predicted = {frozenset((s, ref["dup_of"])) for s, ref in d.items() if ref["dup_of"] != s}
    assert truth, "the corpus must plant some duplicates above the threshold"
    precision = len(truth & predicted) / len(predicted)
    recall = len(truth & predicted) / len(truth)
    assert precision >= 0.98 and recall >= 0.95, (precision, recall)
    assert all(ref["jaccard"] >= threshold for s, ref in d.items() if ref["dup_of"] != s)


@pytest.mark.parametrize(
    "params, field",
    [({"threshold": 1.5}, "threshold"), ({"threshold": 0}, "threshold"), ({"num_perm": 1}, "num_perm"),
     ({"bands": 20, "rows": 10}, "params"), ({"shingle": "byte"}, "shingle"), ({"bogus": 1}, "bogus")],
)
def test_bad_params_name_the_file_and_field(tmp_path, params, field):
    graph = {"dedup": {"op": "minhash_dedup", "params": params}, "samples": {"sink": "samples", "after": ["dedup"]}}
    with pytest.raises(SpecError) as info:
        build_graph(spec_for(tmp_path, tmp_path / "lake", graph), source="jobs/x.yaml")
    assert "jobs/x.yaml: graph.dedup.params" in str(info.value) and field in str(info.value)

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of

from operators.dedup.clustering import (
    ConvergenceError,
    MarkDuplicates,
    choose_keepers,
    connected_components,
    near_duplicate_clusters,
)
from operators.dedup.minhash import MinHasher
from operators.dedup.normalize import normalize_texts
from tests.operators.dedup.arrow_frame import ArrowFrame
from tests.operators.dedup.conftest import edit_words, make_corpus


def edges(pairs):
    ids, keys = [], []
    for key, members in pairs.items():
        for m in members:
            ids.append(m)
            keys.append(key)
    return ArrowFrame(pa.table({"sample_id": pa.array(ids, pa.string()), "band_key": pa.array(keys, pa.int64())}), batch_size=3)


def as_dict(frame, key, value):
    table = frame.to_arrow()
    return dict(zip(table.column(key).to_pylist(), table.column(value).to_pylist()))


def test_components_of_a_long_chain_and_singletons():
    # a chain h-g-f-e-d-c-b-a (each link a different band key) needs many plain rounds.
    chain = "hgfedcba"
    graph = {i: [chain[i], chain[i + 1]] for i in range(len(chain) - 1)}
    graph[100] = ["x", "y"]
    graph[200] = ["lonely"]  # a band key with one member is no edge
    labels = as_dict(connected_components(edges(graph)), "sample_id", "cluster_id")
    assert labels == {**{c: "a" for c in chain}, "x": "x", "y": "x"}


def test_convergence_error_names_the_knob():
    chain = "abcdefghijklmnop"
    graph = {i: [chain[i], chain[i + 1]] for i in range(len(chain) - 1)}
    with pytest.raises(ConvergenceError, match="max_iterations"):
        connected_components(edges(graph), max_iterations=1)


def test_keep_rule_prefers_quality_then_smallest_id():
    comps = ArrowFrame(pa.table({"sample_id": ["a", "b", "c", "d", "e"], "cluster_id": ["a", "a", "a", "d", "d"]}))
    scores = ArrowFrame(pa.table({"sample_id": ["a", "b", "c", "d", "e"], "quality_score": [0.1, 0.9, 0.9, None, float("nan")]}))
    keepers = as_dict(choose_keepers(comps, scores), "sample_id", "keeper")
    assert keepers == {"a": "b", "b": "b", "c": "b", "d": "d", "e": "d"}
    assert as_dict(choose_keepers(comps), "sample_id", "keeper") == {"a": "a", "b": "a", "c": "a", "d": "d", "e": "d"}


def test_mark_duplicates_sets_drop_reason_and_ref():
    table = pa.table(
        {"sample_id": ["a", "b", "z"], "keeper": ["a", "a", None], "cluster_id": ["a", "a", None], "is_duplicate": [False, True, None]}
    )
    out = MarkDuplicates()(table)
    assert out.column("_drop_reason").to_pylist() == [None, "near_duplicate", None]
    assert out.column("_drop_ref").to_pylist()[1] == '{"dup_of": "a", "cluster_id": "a"}'
    assert "keeper" not in out.column_names


# Word edit rates of the planted copies: up to 1% gives Jaccard >= ~0.88 (true duplicates),
# 10% and 30% give ~0.45 and ~0.1 (must stay apart). Pairs near the threshold itself
# (J 0.75-0.85) are found with the S-curve's probability, not reliably, so none are planted.
EDIT_RATES = [0.0, 0.002, 0.005, 0.01, 0.1, 0.3]


def test_accuracy_on_planted_near_duplicates(tmp_path):
    """The real ``minhash_dedup`` operator through ``run_job`` (verify off, the default)."""
    threshold = 0.8
    rng = random.Random(5)
    originals = make_corpus(400, seed=11, words=300)
    texts, source = list(originals), list(range(len(originals)))
    for _ in range(400):
        i = rng.randrange(len(originals))
        texts.append(edit_words(originals[i], rng.choice(EDIT_RATES), rng))
        source.append(i)
    # Exact copies (edit rate 0) collapse to one sample_id: score the distinct documents.
    ids = [sample_id_of(t) for t in texts]
    first = {}
    for doc, sid in enumerate(ids):
        first.setdefault(sid, doc)
    distinct = sorted(first.values())
    texts, source, ids = [texts[d] for d in distinct], [source[d] for d in distinct], [ids[d] for d in distinct]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    # Recall-leaning weights (datasketch `weights=`): J ~ 0.9 pairs are found with p = 0.98, not 0.93.
    params = {"threshold": threshold, "false_positive_weight": 0.3, "false_negative_weight": 0.7, "incremental": False}
    spec = validate_job_spec({"name": "accuracy", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / "in" / "*.jsonl")}],
                              "graph": {"dedup": {"op": "minhash_dedup", "params": params},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}})
    run_job(spec, engine=ArrowEngine(batch_size=128))
    lineage = Lake(tmp_path / "lake").read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped")).to_pylist()
    assert {row["reason"] for row in dropped} == {"near_duplicate"}
    position = {sid: doc for doc, sid in enumerate(ids)}
    predicted = np.arange(len(texts))
    for row in dropped:  # a dropped sample and its keeper share the keeper's cluster
        ref = json.loads(row["ref"])
        predicted[position[row["sample_id"]]] = position[ref["dup_of"]]

    # Ground truth: components of the exact-Jaccard >= threshold graph (pairs within a family).
    hasher = MinHasher()
    hashes, offsets = hasher.shingler(normalize_texts(pa.array(texts)))
    sets = [set(hashes[offsets[i] : offsets[i + 1]].tolist()) for i in range(len(texts))]
    truth = np.arange(len(texts))

    def find(x):
        while truth[x] != x:
            x = truth[x]
        return x

    families: dict[int, list[int]] = {}
    for doc, src in enumerate(source):
        families.setdefault(src, []).append(doc)
    n_true_edges = 0
    for members in families.values():
        for k, a in enumerate(members):
            for b in members[k + 1 :]:
                if len(sets[a] & sets[b]) >= threshold * len(sets[a] | sets[b]):
                    n_true_edges += 1
                    ra, rb = find(a), find(b)
                    truth[max(ra, rb)] = min(ra, rb)
    truth = np.array([find(x) for x in range(len(texts))])
    assert n_true_edges > 100

    def pairs(labels):
        out = set()
        for label in np.unique(labels):
            members = np.flatnonzero(labels == label).tolist()
            out.update((a, b) for k, a in enumerate(members) for b in members[k + 1 :])
        return out

    true_pairs, predicted_pairs = pairs(truth), pairs(predicted)
    tp = len(true_pairs & predicted_pairs)
    precision, recall = tp / len(predicted_pairs), tp / len(true_pairs)
    assert precision >= 0.98, (precision, recall)
    assert recall >= 0.95, (precision, recall)


def test_band_keys_signed_slice_by_slice_equal_one_pass(monkeypatch):
    """BandKeys signs ``SIGNATURE_ROWS`` documents at a time; the rows are those of one pass over the block,
    in order, with empty texts (no row) falling anywhere in a slice."""
    from operators.dedup import clustering

    texts = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 9)) for i in range(40)]
    table = pa.table({"sample_id": [f"{i:04x}" for i in range(40)], "text": texts})
    step = clustering.BandKeys(MinHasher(num_perm=16, seed=5, ngram=2), bands=4, rows=4)
    whole = step(table)
    monkeypatch.setattr(clustering, "SIGNATURE_ROWS", 7)
    sliced = step(table)
    assert sliced.num_rows == whole.num_rows == sum(1 for t in texts if t)
    assert sliced.combine_chunks().equals(whole.combine_chunks())

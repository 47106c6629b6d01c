"""Recall of ``minhash_dedup`` with ``verify: true`` on near duplicates of exactly known Jaccard.

Documents are runs of distinct tokens, so every word 5-gram is distinct and a copy whose last
``k`` of ``n`` words are replaced by fresh tokens has exact Jaccard ``(n-k-4) / (n+k-4)``
with its original. With ``n = 204``: ``k`` 17..22 gives 0.802..0.843 (must be removed at
threshold 0.8), ``k = 33`` gives 0.717 (must be kept: a candidate often, never confirmed).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of
from operators.dedup.lsh import candidate_probability, optimal_bands, recall_bands
from operators.dedup.minhash import MinHasher
from operators.dedup.normalize import normalize_texts
from operators.dedup.params import MinhashDedupParams
from operators.dedup.verify import jaccard_pairs
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark, shared with tests/engines)

WORDS = 204
NEAR_EDITS = range(17, 23)  # Jaccard 0.802 .. 0.843
FAR_EDITS = 33  # Jaccard 0.717


def exact_jaccard(n_words: int, replaced: int) -> float:
    return (n_words - replaced - 4) / (n_words + replaced - 4)


def planted(n_pairs: int, n_far: int, *, seed: int) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """Texts, (original, near copy) pairs to merge and (original, far copy) pairs to keep apart."""
    rng = random.Random(seed)
    texts: list[str] = []
    near: list[tuple[str, str]] = []
    far: list[tuple[str, str]] = []
    for doc in range(n_pairs + n_far):
        words = [f"d{doc}w{i}" for i in range(WORDS)]
        replaced = FAR_EDITS if doc >= n_pairs else rng.choice(NEAR_EDITS)
        copy = words[: WORDS - replaced] + [f"d{doc}x{i}" for i in range(replaced)]
        original_text, copy_text = " ".join(words), " ".join(copy)
        texts += [original_text, copy_text]
        (far if doc >= n_pairs else near).append((original_text, copy_text))
    order = list(range(len(texts)))
    rng.shuffle(order)
    return [texts[i] for i in order], near, far


def run(tmp_path: Path, texts: list[str], engine, params: dict | None = None) -> set[str]:
    """Sample ids dropped as near duplicates by a verified ``minhash_dedup`` run."""
    inputs = tmp_path / "in"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    lake_root = tmp_path / "lake"
    graph = {"dedup": {"op": "minhash_dedup", "params": {"verify": True, **(params or {})}},
             "samples": {"sink": "samples", "after": ["dedup"]}}
    spec = validate_job_spec({"name": "recall", "lake": {"root": str(lake_root)}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
                              "graph": graph}, source="jobs/recall.yaml")
    run_job(spec, engine=engine)
    lineage = Lake(lake_root).read("lineage", columns=["sample_id", "action", "reason"])
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    assert set(dropped.column("reason").to_pylist()) <= {"near_duplicate"}
    return set(dropped.column("sample_id").to_pylist())


def test_planted_pairs_have_the_exact_jaccard_the_test_claims():
    texts, near, far = planted(30, 10, seed=1)
    shingler = MinHasher().shingler
    for pairs, lo, hi in ((near, 0.80, 0.85), (far, 0.70, 0.75)):
        left, left_offsets = shingler(normalize_texts(pa.array([a for a, _ in pairs])))
        right, right_offsets = shingler(normalize_texts(pa.array([b for _, b in pairs])))
        similarity = jaccard_pairs(left, left_offsets, right, right_offsets)
        assert ((similarity >= lo) & (similarity < hi)).all(), similarity
    assert exact_jaccard(WORDS, 22) == pytest.approx(178 / 222)


def test_shingle_sets_once_per_document_give_the_exact_jaccard_of_the_texts():
    import numpy as np

    from operators.dedup.verify import ANCHOR, ANCHOR_SHINGLE_SET, SHINGLE_SET, SetJaccard, ShingleSets

    texts, near, far = planted(20, 10, seed=5)
    texts += ["short text", ""]  # a set far smaller than the others (size filter) and an empty one
    shingler, normalization = MinHasher().shingler, MinhashDedupParams().normalization.build()
    sets = ShingleSets(shingler, normalization)(pa.table({"sample_id": [str(i) for i in range(len(texts))], "text": texts}))
    rng = np.random.default_rng(0)
    left, right = rng.integers(0, len(texts), 400), rng.integers(0, len(texts), 400)
    left[:40] = right[:40] = np.arange(40)  # identical pairs
    column = sets.column(SHINGLE_SET)
    pairs = pa.table({"sample_id": [str(i) for i in left], ANCHOR: [str(i) for i in right],
                      SHINGLE_SET: column.take(pa.array(left)), ANCHOR_SHINGLE_SET: column.take(pa.array(right))}).slice(3)
    a, a_offsets = shingler(normalize_texts(pa.array([texts[i] for i in left[3:]]), normalization))
    b, b_offsets = shingler(normalize_texts(pa.array([texts[i] for i in right[3:]]), normalization))
    expected = jaccard_pairs(a, a_offsets, b, b_offsets)
    for threshold in (0.8, 0.3, 0.01):
        confirmed = SetJaccard(threshold)(pairs)
        assert sorted(confirmed.column("jaccard").to_pylist()) == pytest.approx(sorted(expected[expected >= threshold]))


def test_verify_chooses_bands_for_recall_and_keeps_explicit_choices():
    verified = MinhashDedupParams(verify=True)
    bands, rows = verified.lsh_bands()
    assert (bands, rows) == recall_bands(0.8, 128) == (16, 6)
    assert candidate_probability(0.8, bands, rows) >= 0.99
    assert candidate_probability(0.8, *optimal_bands(0.8, 128)) < 0.5  # the balanced choice misses most pairs at 0.8
    assert MinhashDedupParams().lsh_bands() == optimal_bands(0.8, 128) == (9, 13)  # unverified: balanced, as before
    assert MinhashDedupParams(verify=True, bands=14, rows=8).lsh_bands() == (14, 8)
    weighted = MinhashDedupParams(verify=True, false_positive_weight=0.5, false_negative_weight=0.5)
    assert weighted.lsh_bands() == (9, 13)  # weights given explicitly: respected
    stricter = MinhashDedupParams(verify=True, recall_target=0.999).lsh_bands()
    assert candidate_probability(0.8, *stricter) >= 0.999


def test_recall_of_near_duplicates_at_jaccard_080_to_085_with_verify(tmp_path):
    texts, near, far = planted(150, 40, seed=7)
    dropped = run(tmp_path, texts, ArrowEngine())
    copies = {sample_id_of(max(pair, key=sample_id_of)) for pair in near}  # the keep rule keeps the smallest id
    found = len(dropped & copies) / len(copies)
    # candidate probability >= 0.992 per pair at these Jaccards: ~1 pair of 150 missed on average
    assert found >= 0.97, f"recall {found:.3f} of {len(copies)} planted near duplicates"
    assert dropped <= copies, "precision 1.0: only planted copies are removed, never a far copy or an original"
    far_ids = {sample_id_of(t) for pair in far for t in pair}
    assert not dropped & far_ids


def test_ray_and_spark_drop_the_same_samples(tmp_path, ray_engine, spark_engine):  # noqa: F811
    texts, near, _ = planted(25, 10, seed=3)
    # a chain: c1 ~ c2 and c2 ~ c3 at 0.818, c1 vs c3 at 0.667; all three form one true cluster
    chain = [f"c{i}" for i in range(WORDS)]
    c2 = chain[20:] + [f"cx{i}" for i in range(20)]
    c3 = c2[20:] + [f"cy{i}" for i in range(20)]
    texts += [" ".join(chain), " ".join(c2), " ".join(c3)]
    on_ray = run(tmp_path / "ray", texts, ray_engine)
    on_spark = run(tmp_path / "spark", texts, spark_engine)
    assert on_ray == on_spark
    assert len(on_ray) >= len(near)  # every planted pair or the chain found at least somewhere

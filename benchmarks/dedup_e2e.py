"""Whole fuzzy dedup against complete ground truth: datahub's ``minhash_dedup`` vs datatrove's MinHash pipeline.

Corpus: English man pages with planted near duplicates (``_corpus.planted_corpus``: 70% real pages, which
have natural near duplicates of their own, 30% copies edited at known word-edit rates), at ~1k, ~5k and ~25k
documents, written as two JSONL files read by both tools.

Ground truth (``_ground_truth``): *every* pair with exact word-5-gram Jaccard >= 0.8 (our normalization),
found by prefix filtering and checked by exact set intersection, not sampled; its connected components are
the true clusters. Scores are per document, as a user sees them: precision = share of removed documents that
have a true near duplicate; recall = of the documents an ideal dedup removes (all but one per true
cluster), the share removed.

datahub: ``run_job`` as a user runs it: default ``minhash_dedup`` params (threshold 0.8, 128 permutations,
word 5-grams) with ``verify: true`` (so (bands, rows) are chosen for recall, ``lsh.recall_bands``), on the
default engine (an embedded Ray, started for the run and counted in its time; start-up also shown apart),
ingest JSONL -> dedup -> Delta commits of samples, lineage and the minhash_index. Removed documents are
read from the lineage. datatrove: its four stages (14 buckets x 8 hashes, its defaults, 64-bit hashes) with
LocalPipelineExecutor, 2 workers, in the same sitting.

Ends with ``recall_verified:`` and ``precision_verified:`` (the lowest over the sizes; goals >= 0.95 and
>= 0.99), ``time_ratio_vs_datatrove:`` (largest size, goal <= 0.25) and ``small_time_ratio_vs_datatrove:``
(smallest size, goal <= 1.0).

    .venv/bin/python benchmarks/dedup_e2e.py --sizes 1000,5000,25000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from benchmarks._corpus import components, exact_jaccard_pairs, planted_corpus  # noqa: E402
from benchmarks._ground_truth import exact_pairs_prefix_filtered, removal_scores  # noqa: E402
from operators.dedup.lsh import candidate_probability  # noqa: E402
from operators.dedup.minhash import MinHasher  # noqa: E402
from operators.dedup.normalize import normalize_texts  # noqa: E402
from operators.dedup.params import MinhashDedupParams  # noqa: E402

DT_BANDS, DT_ROWS, NGRAM = 14, 8, 5  # datatrove's defaults; word 5-grams as both tools' default
THRESHOLD = 0.8


def run_operator(input_dir: Path, lake_root: Path, *, engine_kind: str, verify: bool) -> tuple[float, float, dict[str, int]]:
    """``run_job`` on a fresh embedded engine: ``(total seconds incl. start-up, start-up seconds,
    removed rows per sample_id)``."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.engines.registry import make_engine
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job

    spec = validate_job_spec({"name": "bench", "lake": {"root": str(lake_root)}, "inputs": [{"uri": str(input_dir / "*.jsonl")}],
                              "engine": {"kind": "ray" if engine_kind == "arrow" else engine_kind},
                              "graph": {"dedup": {"op": "minhash_dedup", "params": {"verify": verify, "incremental": False}},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}})
    start = time.perf_counter()
    engine = ArrowEngine(batch_size=1024) if engine_kind == "arrow" else make_engine(spec.engine)
    engine.start()
    started = time.perf_counter() - start
    try:
        run_job(spec, engine=engine)
    finally:
        engine.stop()
    elapsed = time.perf_counter() - start
    lineage = Lake(lake_root).read("lineage", columns=["sample_id", "action"])
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped")).column("sample_id").to_pylist()
    removed: dict[str, int] = {}
    for sample_id in dropped:
        removed[sample_id] = removed.get(sample_id, 0) + 1
    return elapsed, started, removed


def _stub_tokenizers(folder: Path) -> None:
    """datatrove.pipeline.dedup imports HF `tokenizers` (for exact-substring dedup) at import
    time; MinHash never uses it. If it is not installed, put an inert stand-in on the path
    (via PYTHONPATH too, so datatrove's worker processes see it)."""
    import importlib.util
    import os

    if importlib.util.find_spec("tokenizers") is not None:
        return
    package = folder / "tokenizers"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("Tokenizer = object\n")
    (package / "processors.py").write_text("TemplateProcessing = object\n")
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def _xxhash64_of_str(text: str) -> int:
    # datatrove 0.10.1 passes str to xxhash.xxh64_intdigest, which the installed xxhash
    # rejects ("Strings must be encoded"); the same hash of the UTF-8 bytes, as intended.
    import xxhash

    return xxhash.xxh64_intdigest(text.encode("utf-8"))


def run_datatrove(input_dir: Path, work: Path) -> tuple[float, set[str]]:
    _stub_tokenizers(work / "stubs")
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    config = MinhashConfig(n_grams=NGRAM, num_buckets=DT_BANDS, hashes_per_bucket=DT_ROWS, hash_config=HashConfig(precision=64))
    reader = JsonlReader(str(input_dir), glob_pattern="*.jsonl")
    start = time.perf_counter()
    common = {"workers": 2, "logging_dir": None, "skip_completed": False}
    signature = MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)
    signature._hash_func = _xxhash64_of_str
    LocalPipelineExecutor([reader, signature], tasks=2, **common).run()
    LocalPipelineExecutor(
        [MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=config)],
        tasks=DT_BANDS,
        **common,
    ).run()
    LocalPipelineExecutor(
        [MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove"), config=config, save_cluster_id=True)],
        tasks=1,
        **common,
    ).run()
    LocalPipelineExecutor(
        [
            JsonlReader(str(input_dir), glob_pattern="*.jsonl"),
            MinhashDedupFilter(
                input_folder=str(work / "remove"),
                exclusion_writer=JsonlWriter(str(work / "removed"), compression=None),
                load_cluster_ids=True,
            ),
            JsonlWriter(str(work / "kept"), compression=None),
        ],
        tasks=2,
        **common,
    ).run()
    elapsed = time.perf_counter() - start
    removed = {json.loads(line)["id"] for path in (work / "removed").glob("*.jsonl") for line in path.read_text().splitlines()}
    return elapsed, removed


def removed_mask(sample_ids: list[str], removed: dict[str, int]) -> np.ndarray:
    """Documents removed, from removed-row counts per sample_id (identical texts share one id: any of them)."""
    left = dict(removed)
    mask = np.zeros(len(sample_ids), dtype=bool)
    for i, sample_id in enumerate(sample_ids):
        if left.get(sample_id, 0) > 0:
            mask[i] = True
            left[sample_id] -= 1
    return mask


def one_size(size: int, tmp_path: Path, engine_kind: str, check_truth: bool) -> dict[str, float]:
    from datahub.sample_id import sample_id_of

    texts, _ = planted_corpus(size)
    ids = [f"doc{i:07d}" for i in range(len(texts))]
    input_dir = tmp_path / f"input-{size}"
    input_dir.mkdir()
    half = len(texts) // 2
    for part, (lo, hi) in enumerate([(0, half), (half, len(texts))]):
        (input_dir / f"part{part}.jsonl").write_text(
            "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids[lo:hi], texts[lo:hi])))

    start = time.perf_counter()
    hashes, offsets = MinHasher(ngram=NGRAM).shingler(normalize_texts(pa.array(texts)))
    pairs, similarity, n_candidates = exact_pairs_prefix_filtered(hashes, offsets, THRESHOLD)
    truth_s = time.perf_counter() - start
    if check_truth:  # the prefix filter against the all-pairs sparse product (quadratic: small sizes only)
        brute = exact_jaccard_pairs(hashes, offsets, THRESHOLD)
        if set(map(tuple, brute.tolist())) != set(map(tuple, pairs.tolist())):
            raise SystemExit(f"ground truth mismatch at {size} docs: prefix filter {len(pairs)} pairs, all-pairs {len(brute)}")
    truth = components(len(texts), pairs)
    ideal = len(texts) - len(np.unique(truth))

    op_s, startup_s, op_removed = run_operator(input_dir, tmp_path / f"lake-{size}", engine_kind=engine_kind, verify=True)
    op_mask = removed_mask([sample_id_of(t) for t in texts], op_removed)
    dt_s, dt_removed = run_datatrove(input_dir, tmp_path / f"datatrove-{size}")
    dt_mask = np.array([i in dt_removed for i in ids])
    op_p, op_r = removal_scores(truth, op_mask)
    dt_p, dt_r = removal_scores(truth, dt_mask)
    print(f"[{len(texts)} docs] ground truth: {len(pairs)} pairs >= {THRESHOLD} ({n_candidates} prefix-filter candidates, "
          f"{truth_s:.1f} s{', equal to all-pairs' if check_truth else ''}), {ideal} removable; pair Jaccard quartiles "
          f"{np.round(np.quantile(similarity, [0.25, 0.5, 0.75]), 3).tolist() if len(similarity) else []}")
    print(f"[{len(texts)} docs] datahub ({engine_kind}, verify): {op_s:7.2f} s (engine start-up {startup_s:.2f} s)  "
          f"removed {int(op_mask.sum())}  precision {op_p:.4f} recall {op_r:.4f}")
    print(f"[{len(texts)} docs] datatrove          : {dt_s:7.2f} s                          "
          f"removed {int(dt_mask.sum())}  precision {dt_p:.4f} recall {dt_r:.4f}")
    sys.stdout.flush()
    return {"docs": len(texts), "op_s": op_s, "startup_s": startup_s, "dt_s": dt_s, "op_p": op_p, "op_r": op_r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,25000", help="comma-separated corpus sizes, smallest first")
    parser.add_argument("--engine", choices=["ray", "spark", "arrow"], default="ray",
                        help="datahub engine: the default embedded Ray, Spark local, or the in-process ArrowEngine")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from loguru import logger

    logger.remove()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    bands, rows = MinhashDedupParams(verify=True).lsh_bands()
    print(f"datahub params: threshold {THRESHOLD}, 128 permutations, word {NGRAM}-grams, verify -> {bands} bands x {rows} rows")
    curve = {s: float(candidate_probability(s, bands, rows)) for s in (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)}
    print("candidate probability by Jaccard (1 - (1 - s^r)^b): " + ", ".join(f"{s}: {p:.3f}" for s, p in curve.items()))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            results.append(one_size(size, Path(tmp), args.engine, check_truth=size <= 2000))
    small, large = results[0], results[-1]
    print()
    print(f"recall_verified: {min(r['op_r'] for r in results):.4f}")
    print(f"precision_verified: {min(r['op_p'] for r in results):.4f}")
    print(f"time_ratio_vs_datatrove: {large['op_s'] / large['dt_s']:.3f}")
    print(f"small_time_ratio_vs_datatrove: {small['op_s'] / small['dt_s']:.3f}")
    print(f"small_startup_share: {small['startup_s'] / small['op_s']:.3f}")
    sys.stdout.flush()
    os._exit(0)  # delta-rs can abort at interpreter exit


if __name__ == "__main__":
    main()

"""Whole fuzzy dedup, datahub's ``minhash_dedup`` operator vs datatrove's MinHash pipeline, on the same JSONL.

Corpus: English man pages with planted near-duplicates (``_corpus.planted_corpus``), written
as two JSONL files read by both. Same parameters for both: word 5-grams, 14 bands x 8 rows
(112 permutations, datatrove's defaults), 64-bit hashes.

datahub: ``run_job`` with ``minhash_dedup`` on the in-process ArrowEngine (ingest JSONL ->
normalize -> signatures -> band keys -> connected components -> keep rule -> Delta commits
of samples, lineage and the minhash_index), once without and once with ``verify`` (exact
Jaccard on candidate pairs). datatrove: its four stages with LocalPipelineExecutor, workers=2
(tasks=2 for signatures and filtering, tasks=14 = num_buckets for bucketing, which it
requires, tasks=1 for clustering), JSONL in and out.

Ground truth: connected components of the pairs whose exact word-5-gram Jaccard (our
normalization) is >= --threshold; F1 is pairwise over same-cluster pairs. Ends with
``time_ratio_vs_datatrove: X`` (datahub seconds / datatrove seconds, verified run; the goal
is <= 0.25), ``f1: X`` (datahub, verified) and ``f1_datatrove: X``.

    .venv/bin/python benchmarks/dedup_e2e.py --docs 3000
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from benchmarks._corpus import components, exact_jaccard_pairs, pair_scores, planted_corpus  # noqa: E402
from operators.dedup.minhash import MinHasher  # noqa: E402
from operators.dedup.normalize import normalize_texts  # noqa: E402

BANDS, ROWS, NGRAM = 14, 8, 5
THRESHOLD = 0.75  # set from --threshold


def run_operator(input_dir: Path, lake_root: Path, *, verify: bool) -> tuple[float, dict[str, str], int]:
    """The real operator path: ``run_job`` (ingest JSONL -> minhash_dedup -> samples/lineage/index
    commits to a Delta lake) on the in-process ArrowEngine. Clusters from the lineage ``cluster_id``."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job

    params = {"num_perm": BANDS * ROWS, "bands": BANDS, "rows": ROWS, "ngram": NGRAM, "scheme": "affine64", "verify": verify,
              "threshold": THRESHOLD, "incremental": False}
    spec = validate_job_spec({"name": "bench", "lake": {"root": str(lake_root)}, "inputs": [{"uri": str(input_dir / "*.jsonl")}],
                              "graph": {"dedup": {"op": "minhash_dedup", "params": params},
                                        "samples": {"sink": "samples", "after": ["dedup"]}}})
    start = time.perf_counter()
    result = run_job(spec, engine=ArrowEngine(batch_size=1024))
    elapsed = time.perf_counter() - start
    lineage = Lake(lake_root).read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    labels = {}
    for row in dropped.select(["sample_id", "ref"]).to_pylist():
        ref = json.loads(row["ref"])
        labels[row["sample_id"]] = ref["cluster_id"]
        labels[ref["dup_of"]] = ref["cluster_id"]
    return elapsed, labels, int(result.counts["samples_written"])


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


def run_datatrove(input_dir: Path, work: Path) -> tuple[float, dict[str, str], int]:
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

    config = MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS, hash_config=HashConfig(precision=64))
    reader = JsonlReader(str(input_dir), glob_pattern="*.jsonl")
    start = time.perf_counter()
    common = {"workers": 2, "logging_dir": None, "skip_completed": False}
    signature = MinhashDedupSignature(output_folder=str(work / "sigs"), config=config)
    signature._hash_func = _xxhash64_of_str
    LocalPipelineExecutor([reader, signature], tasks=2, **common).run()
    LocalPipelineExecutor(
        [MinhashDedupBuckets(input_folder=str(work / "sigs"), output_folder=str(work / "buckets"), config=config)],
        tasks=BANDS,
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
    labels: dict[str, str] = {}
    kept = 0
    for folder in ("kept", "removed"):
        for path in sorted((work / folder).glob("*.jsonl")):
            for record in map(json.loads, path.read_text().splitlines()):
                kept += folder == "kept"
                cluster = (record.get("metadata") or {}).get("minhash_cluster_id")
                if cluster is not None and cluster != -1:
                    labels[record["id"]] = str(cluster)
    return elapsed, labels, kept


def to_labels(ids: list[str], clusters: dict[str, str]) -> np.ndarray:
    codes: dict[str, int] = {}
    out = np.arange(len(ids))
    for i, doc in enumerate(ids):
        if doc in clusters:
            out[i] = len(ids) + codes.setdefault(clusters[doc], len(codes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--threshold", type=float, default=0.75, help="ground-truth exact Jaccard threshold")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    from loguru import logger

    logger.remove()

    texts, _ = planted_corpus(args.docs)
    ids = [f"doc{i:07d}" for i in range(len(texts))]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        input_dir = tmp_path / "input"
        input_dir.mkdir()
        half = len(texts) // 2
        for part, (lo, hi) in enumerate([(0, half), (half, len(texts))]):
            (input_dir / f"part{part}.jsonl").write_text(
                "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids[lo:hi], texts[lo:hi])))

        hasher = MinHasher(ngram=NGRAM)
        hashes, offsets = hasher.shingler(normalize_texts(pa.array(texts)))
        truth = components(len(texts), exact_jaccard_pairs(hashes, offsets, args.threshold))
        n_true_dups = len(texts) - len(np.unique(truth))

        global THRESHOLD
        THRESHOLD = args.threshold
        op_results = {}
        for verify in (False, True):
            op_results[verify] = run_operator(input_dir, tmp_path / f"lake-{verify}", verify=verify)
        dt_s, dt_clusters, dt_kept = run_datatrove(input_dir, tmp_path / "datatrove")

    from datahub.sample_id import sample_id_of

    sample_ids = [sample_id_of(t) for t in texts]
    for verify, (op_s, op_clusters, op_kept) in op_results.items():
        op_p, op_r, op_f1 = pair_scores(truth, to_labels(sample_ids, op_clusters))
        print(f"operator (run_job, ArrowEngine, verify={verify}): {op_s:7.2f} s  kept {op_kept}  removed {len(texts) - op_kept}  "
              f"precision {op_p:.3f} recall {op_r:.3f} f1 {op_f1:.3f}")
    dp, dr, df1 = pair_scores(truth, to_labels(ids, dt_clusters))
    print(f"docs: {len(texts)}; ground truth (exact Jaccard >= {args.threshold}): {n_true_dups} removable duplicates")
    print(f"params: word {NGRAM}-grams, {BANDS} bands x {ROWS} rows, 64-bit hashes")
    print(f"datatrove : {dt_s:7.2f} s  kept {dt_kept}  removed {len(texts) - dt_kept}  precision {dp:.3f} recall {dr:.3f} f1 {df1:.3f}")
    print()
    op_s, op_clusters, _ = op_results[True]
    op_f1 = pair_scores(truth, to_labels(sample_ids, op_clusters))[2]
    unverified_s, unverified_clusters, _ = op_results[False]
    print(f"unverified_time_ratio_vs_datatrove: {unverified_s / dt_s:.3f}")
    print(f"unverified_f1: {pair_scores(truth, to_labels(sample_ids, unverified_clusters))[2]:.3f}")
    print(f"time_ratio_vs_datatrove: {op_s / dt_s:.3f}")
    print(f"f1: {op_f1:.3f}")
    print(f"f1_datatrove: {df1:.3f}")


if __name__ == "__main__":
    main()

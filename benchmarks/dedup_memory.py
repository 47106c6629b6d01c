"""Peak memory of a whole dedup run (exact + MinHash) as the input grows, up to 1M short documents.

Issue goal: peak memory grows linearly with the input and stays under 2 GB for 1M short
documents. Each size runs ``datahub run`` in a fresh process (embedded engine, as cron would
run it) over JSONL shards of short synthetic documents (60 words, Zipf vocabulary),
10% of them near-duplicates (one word changed) and 5% exact copies, so the clustering and
keep-rule joins have real work. Memory is the peak summed PSS of the run's process tree
(benchmarks/_procmem.py: driver, raylet and workers; shared object-store pages count once).

Ends with ``peak_mb_at_<N>: X`` for the largest size and ``memory_growth_exponent: X``, the
log-log slope of peak memory over document count from the smallest to the largest size
(1.0 = linear; below 1 = a fixed start-up cost dominates).

    .venv/bin/python benchmarks/dedup_memory.py --sizes 125000,250000,500000,1000000 --object-store-mb 256

``--object-store-mb`` caps the embedded Ray's shared-memory store (``engine.object_store_mb``); its pages count
in the peak, so the cap moves it one for one. Without it Ray takes 30% of RAM for the store.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._procmem import run_measured  # noqa: E402

WORDS_PER_DOC = 60  # one changed word leaves word-5-gram Jaccard 0.84 >= the 0.8 default threshold
VOCABULARY = 50_000


def short_docs(count: int, *, seed: int = 0) -> list[str]:
    """``count`` short documents; the last 15% are copies of earlier ones (10% with one word changed)."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(VOCABULARY)])
    n_near, n_exact = count // 10, count // 20
    n_orig = count - n_near - n_exact
    ids = np.minimum(rng.zipf(1.2, (n_orig, WORDS_PER_DOC)) - 1, VOCABULARY - 1)
    near_src = rng.integers(0, n_orig, n_near)
    near = ids[near_src].copy()
    near[np.arange(n_near), rng.integers(0, WORDS_PER_DOC, n_near)] = rng.integers(0, VOCABULARY, n_near)
    exact = ids[rng.integers(0, n_orig, n_exact)]
    words = vocab[np.concatenate([ids, near, exact])]
    return [" ".join(row) for row in words.tolist()]


def write_shards(folder: Path, texts: list[str], shards: int) -> float:
    folder.mkdir(parents=True)
    per = -(-len(texts) // shards)
    total = 0
    for i in range(shards):
        chunk = "".join(json.dumps({"text": t}) + "\n" for t in texts[i * per:(i + 1) * per])
        total += len(chunk)
        (folder / f"part-{i:03d}.jsonl").write_text(chunk)
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="125000,250000,500000,1000000")
    parser.add_argument("--engine", choices=["ray", "spark"], default="ray")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--object-store-mb", type=int, default=None, help="engine.object_store_mb (embedded Ray)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    datahub = str(Path(sys.executable).parent / "datahub")
    results = []
    with tempfile.TemporaryDirectory(prefix="datahub-bench-dedup-memory-") as tmp:
        for size in sizes:
            work = Path(tmp) / str(size)
            mb = write_shards(work / "in", short_docs(size), args.shards)
            job = work / "job.yaml"
            job.write_text(json.dumps({
                "name": "bench-dedup-memory",
                "engine": {"kind": args.engine, **({"object_store_mb": args.object_store_mb} if args.object_store_mb else {})}, "lake": {"root": str(work / "lake")},
                "inputs": [{"uri": str(work / "in" / "*.jsonl")}],
                "graph": {"exact": {"op": "exact_dedup"},
                          "dedup": {"op": "minhash_dedup", "after": ["exact"]},
                          "samples": {"sink": "samples", "after": ["dedup"]}}}))
            measured = run_measured([datahub, "run", str(job), "--json"], env=env, cwd=str(REPO))
            if measured.returncode != 0:
                raise SystemExit(f"run of {size} documents failed ({measured.returncode}):\n{measured.stderr[-3000:]}")
            counts = json.loads(measured.stdout[measured.stdout.index("{"):])["counts"]
            results.append((size, measured.peak_mb))
            print(f"{size:>9,d} docs  {mb:7.1f} MB input  wall {measured.wall_s:7.1f} s  peak PSS {measured.peak_mb:8.1f} MB  "
                  f"written {counts['samples_written']:,}  dropped {counts['dropped_total']:,}", flush=True)
    (n0, m0), (n1, m1) = results[0], results[-1]
    print(f"peak_mb_at_{n1}: {m1:.0f}")
    print(f"memory_growth_exponent: {math.log(m1 / m0) / math.log(n1 / n0):.2f}" if n1 > n0 else "memory_growth_exponent: n/a")


if __name__ == "__main__":
    main()

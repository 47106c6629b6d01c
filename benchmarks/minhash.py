"""MinHash throughput, one core: datahub vs datasketch (update_batch) vs rensa.

Same documents (English man pages, see _corpus.py), 128 permutations, word 5-grams.
Text normalization runs once up front for everyone (excluded for all). Two modes:

- ``full`` (the headline): from normalized text to signatures, *including* tokenizing,
  5-gram shingling and shingle hashing for every library (peers shingle in Python,
  as their users do; rensa gets its fastest batch API, ``digest_matrix_from_token_sets``).
  Ours is ``MinHasher.signatures``: the compiled C path (``operators/dedup/accel.py``); ``numpy`` is the same
  call with ``DATAHUB_MINHASH_COMPILED=0``, printed for reference.
- ``kernel``: shingle hashes precomputed for everyone (ours), only permute + min:
  ours ``signatures_from_hashes`` (numpy), rensa ``digest_matrix_from_flat_token_hashes``,
  datasketch ``update_batch`` with an identity ``hashfunc``.

Prints docs/s and MB/s (of normalized text) per library and mode, then the ratio lines of
the ``full`` mode: ``speedup_vs_datasketch: X`` and ``speedup_vs_rensa: X``. Every library runs in
each of ``--rounds`` interleaved rounds (ours and rensa best of ``--repeat``, datasketch once, as
its run is long); docs/s are medians over rounds, ratios medians of the per-round ratios.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # rensa: one core, like everyone else
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import datasketch  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import rensa  # noqa: E402

from benchmarks._corpus import base_texts  # noqa: E402
from operators.dedup.minhash import MinHasher  # noqa: E402
from operators.dedup.normalize import NO_NORMALIZATION, normalize_texts  # noqa: E402

NUM_PERM, NGRAM, SEED = 128, 5, 1


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def python_shingles(texts: list[str]) -> list[list[str]]:
    out = []
    for text in texts:
        words = text.split()
        out.append([" ".join(words[i : i + NGRAM]) for i in range(max(1, len(words) - NGRAM + 1))])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs per round (datasketch: 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians over them")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    normalized = normalize_texts(pa.array(base_texts(args.docs))).to_pylist()
    column = pa.array(normalized, pa.string())
    megabytes = sum(len(t.encode()) for t in normalized) / 1e6
    n = len(normalized)
    ds_texts = normalized  # the same docs for every library (datasketch: one timed run)
    print(f"docs: {n}, {megabytes:.1f} MB normalized text, avg {megabytes * 1e6 / n:.0f} B/doc, "
          f"{NUM_PERM} perms, word {NGRAM}-grams, one core")

    ours = MinHasher(num_perm=NUM_PERM, seed=SEED, ngram=NGRAM, normalization=NO_NORMALIZATION)
    perms = datasketch.MinHash(num_perm=NUM_PERM, seed=SEED, scheme="affine32").permutations

    # datasketch gets its permutations precomputed (MinHash(permutations=...)): building
    # them per document would cost it ~35% more and is not how a careful user runs it.
    def datasketch_full() -> None:
        for shingles in python_shingles(ds_texts):
            m = datasketch.MinHash(num_perm=NUM_PERM, permutations=perms, scheme="affine32")
            m.update_batch([s.encode() for s in shingles])

    hashes, offsets = ours.shingler(column)
    ds_lists = [hashes[offsets[i] : offsets[i + 1]].tolist() for i in range(len(ds_texts))]

    def datasketch_kernel() -> None:
        for values in ds_lists:
            m = datasketch.MinHash(num_perm=NUM_PERM, permutations=perms, scheme="affine32", hashfunc=lambda x: x & 0xFFFFFFFF)
            m.update_batch(values)

    def numpy_path(run: Callable[[], object]) -> None:
        os.environ["DATAHUB_MINHASH_COMPILED"] = "0"
        try:
            run()
        finally:
            os.environ.pop("DATAHUB_MINHASH_COMPILED")

    row_offsets = offsets.astype(np.uint64)
    runs = {
        "full": {
            "datahub": (lambda: ours.signatures(column), args.repeat),
            "numpy": (lambda: numpy_path(lambda: ours.signatures(column)), args.repeat),
            "rensa": (lambda: rensa.RMinHash.digest_matrix_from_token_sets(python_shingles(normalized), NUM_PERM, SEED),
                      args.repeat),
            "datasketch": (datasketch_full, 1),
        },
        "kernel": {
            "datahub": (lambda: ours.signatures_from_hashes(hashes, offsets), args.repeat),
            "rensa": (lambda: rensa.RMinHash.digest_matrix_from_flat_token_hashes(hashes, row_offsets, NUM_PERM, SEED),
                      args.repeat),
            "datasketch": (datasketch_kernel, 1),
        },
    }
    # Rounds interleave the libraries, so a slow spell of this shared machine hits all of them alike;
    # docs/s are medians over rounds and each ratio is the median of the per-round ratios.
    rounds: list[dict[str, dict[str, float]]] = []
    for _ in range(args.rounds):
        rounds.append({mode: {name: n / best_of(fn, repeat) for name, (fn, repeat) in libs.items()}
                       for mode, libs in runs.items()})
    results = {mode: {name: statistics.median(r[mode][name] for r in rounds) for name in libs}
               for mode, libs in runs.items()}

    def ratio(mode: str, peer: str) -> float:
        return statistics.median(r[mode]["datahub"] / r[mode][peer] for r in rounds)

    mb_per_doc = megabytes / n
    for mode, label in (("full", "incl. tokenize+shingle+hash"), ("kernel", "shingle hashes precomputed")):
        print(f"\n[{mode}] {label}")
        for name, docs_per_s in results[mode].items():
            print(f"  {name:<11} {docs_per_s:>10,.0f} docs/s  {docs_per_s * mb_per_doc:>7.1f} MB/s")
        print(f"  ratio vs datasketch: {ratio(mode, 'datasketch'):.1f}x, vs rensa: {ratio(mode, 'rensa'):.2f}x")
    print()
    print(f"speedup_vs_datasketch: {ratio('full', 'datasketch'):.2f}")
    print(f"speedup_vs_rensa: {ratio('full', 'rensa'):.2f}")


if __name__ == "__main__":
    main()

"""Peak memory of a scheduled incremental dedup run (a small new input) as the lake's dedup indexes grow.

An incremental ``exact_dedup`` + ``minhash_dedup`` job dedups its new documents against every sample earlier runs
kept (lake ``exact_index`` and ``minhash_index``: one row per sample, one row per sample and LSH band). The run's
work is the new input; its memory must not grow with the lake. For each lake size the script builds a lake (one
small run, then the indexes grown to ``N`` synthetic samples of another job with the job's params hash: ``N``
exact rows and ``N x bands`` band rows), adds a small new input (100 documents, 2 of them copies of lake samples)
and runs the job in a fresh process (as cron would), on a copy of the lake per tree, measuring the peak PSS of the
driver process and of its whole process tree (``benchmarks/_procmem.py``).

``--old-tree`` runs the same job with another checkout too (e.g. ``git worktree add /tmp/old <commit>``), on its
own copy of the same lake, so before/after come from one window. Ends with ``driver_growth_<tree>: X``, the
driver's peak at the largest lake over the smallest (1.0 = flat).

    .venv/bin/python benchmarks/dedup_index.py --samples 50000,200000 --engine ray --object-store-mb 256 \\
        --old-tree /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._procmem import run_measured  # noqa: E402

CHUNK_SAMPLES = 50_000  # synthetic index rows are generated and committed this many samples at a time
NEW_DOCS = 100
WORDS = 120

CHILD = """
import json, os, sys
from datahub.config.spec import validate_job_spec
from datahub.pipeline.run import run_job
spec = validate_job_spec(json.loads(sys.argv[1]))
engine = None
if sys.argv[2] == "arrow":
    from datahub.engines.arrow import ArrowEngine
    engine = ArrowEngine()
result = run_job(spec, engine=engine)
print(json.dumps({"status": result.status, "error": result.error, "counts": result.counts}))
sys.stdout.flush()
os._exit(0)
"""


def documents(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(5000)])
    return [" ".join(row) for row in vocab[rng.integers(0, len(vocab), (count, WORDS))].tolist()]


def job(root: Path, inputs: Path, engine: str, object_store_mb: int | None) -> dict:
    engine_spec: dict = {"kind": "ray" if engine == "arrow" else engine, "num_cpus": 2}
    if object_store_mb:
        engine_spec["object_store_mb"] = object_store_mb
    return {"name": "bench", "lake": {"root": str(root)}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
            "engine": engine_spec,
            "graph": {"exact": {"op": "exact_dedup"}, "near": {"op": "minhash_dedup", "after": ["exact"]},
                      "samples": {"sink": "samples", "after": ["near"]}}}


def _hex(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    raw = rng.integers(0, 256, size=(n, width // 2), dtype=np.uint8)
    return pa.array([row.tobytes().hex() for row in raw], pa.string())


def grow_indexes(root: Path, samples: int) -> int:
    """Add ``samples`` synthetic samples of an older job to both indexes; returns the band rows added."""
    from datahub.lake import Lake

    lake = Lake(root)
    bands = lake.read("minhash_index").num_rows // max(1, lake.read("exact_index").num_rows)
    hashes = {t: lake.read(t, columns=["params_hash"]).column("params_hash")[0].as_py()
              for t in ("minhash_index", "exact_index")}

    def chunks(table: str) -> Iterator[pa.Table]:
        rng = np.random.default_rng(1)
        for start in range(0, samples, CHUNK_SAMPLES):
            n = min(CHUNK_SAMPLES, samples - start)
            ids = _hex(rng, n, 64)
            if table == "minhash_index":
                columns = {"sample_id": pa.array(np.repeat(ids.to_numpy(zero_copy_only=False), bands), pa.string()),
                           "band_key": pa.array(rng.integers(-2**62, 2**62, n * bands), pa.int64())}
            else:
                columns = {"content_hash": _hex(rng, n, 32), "sample_id": ids}
            rows = len(next(iter(columns.values())))
            columns["params_hash"] = pa.array([hashes[table]] * rows, pa.string())
            columns["run_id"] = pa.array([f"older-job-{start:012x}"] * rows, pa.string())
            yield pa.table(columns)

    for table in hashes:
        lake.commit(table, chunks(table), txn=f"grow-{table}-{samples}")
    return samples * bands


def measure(tree: Path, spec: dict, engine: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    measured = run_measured([sys.executable, "-c", CHILD, json.dumps(spec), engine], env=env, cwd=str(tree))
    if measured.returncode != 0:
        raise SystemExit(f"run with {tree} failed:\n{measured.stderr[-3000:]}")
    result = json.loads(measured.stdout.strip().splitlines()[-1])
    if result["status"] != "succeeded":
        raise SystemExit(f"run with {tree}: {result}")
    return {"driver_peak_mb": round(measured.driver_peak_mb, 1), "tree_peak_mb": round(measured.peak_mb, 1),
            "wall_s": round(measured.wall_s, 1), "samples_written": result["counts"].get("samples_written")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="50000,200000", help="lake sizes: synthetic samples in the indexes")
    parser.add_argument("--engine", choices=["ray", "spark", "arrow"], default="ray",
                        help="the run's engine (arrow: the in-process engine, driver = engine)")
    parser.add_argument("--object-store-mb", type=int, default=256, help="embedded Ray's object store cap")
    parser.add_argument("--old-tree", type=Path, help="another checkout to run the same job with (before/after)")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args()
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    trees = {"new": REPO, **({"old": args.old_tree.resolve()} if args.old_tree else {})}
    sizes = [int(s) for s in args.samples.split(",")]
    rows: list[dict] = []
    with open("/proc/loadavg") as handle:
        print(f"load: {handle.read().split()[:3]}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dedup_index_") as tmp:
        for size in sizes:
            base = Path(tmp) / f"n{size}"
            inputs = base / "inputs"
            inputs.mkdir(parents=True)
            first = documents(NEW_DOCS, seed=1)
            (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in first))
            spec = job(base / "lake", inputs, args.engine, args.object_store_mb)
            assert run_job(validate_job_spec(spec), engine=ArrowEngine()).status == "succeeded"
            band_rows = grow_indexes(base / "lake", size)
            new = documents(NEW_DOCS - 2, seed=2) + first[:2]
            (inputs / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in new))
            for name, tree in trees.items():
                copy = base / f"lake-{name}"
                shutil.copytree(base / "lake", copy)
                row = {"lake_samples": size, "band_rows": band_rows, "tree": name, "engine": args.engine,
                       **measure(tree, job(copy, inputs, args.engine, args.object_store_mb), args.engine)}
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                shutil.rmtree(copy)
            shutil.rmtree(base)
    summary: dict[str, float] = {}
    for name in trees:
        peaks = [r["driver_peak_mb"] for r in rows if r["tree"] == name]
        summary[f"driver_growth_{name}"] = round(peaks[-1] / peaks[0], 2)
        print(f"driver_growth_{name}: {summary[f'driver_growth_{name}']}")
    with open("/proc/loadavg") as handle:
        print(f"load: {handle.read().split()[:3]}", flush=True)
    if args.json:
        print(json.dumps({"rows": rows, **summary}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

"""The same job spec on Ray and on Spark: wall time and peak memory side by side.

Corpus: real English man pages (benchmarks/_corpus.py, no downloads) written as JSONL
shards; graph: normalize -> Gopher quality -> Gopher repetition -> length filter, plus the
registered dedup operators when ``--dedup`` is given. Each engine runs in its own fresh
``datahub run`` process (embedded engine, engine start-up included, as a cron job would
see it); peak memory is the largest summed PSS of that process tree (driver, JVM or raylet
and workers; benchmarks/_procmem.py), sampled every 100 ms. Checks that both runs wrote the same
sample ids, then prints ``time_ratio_spark_vs_ray: X`` (above 1: Spark is slower).

    .venv/bin/python benchmarks/engines.py --docs 20000 --shards 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._corpus import base_texts, write_jsonl  # noqa: E402
from benchmarks._procmem import run_measured  # noqa: E402

def run_engine(engine: str, job: Path, lake: Path) -> dict:
    args = [str(Path(sys.executable).parent / "datahub"), "run", str(job), "--engine", engine, "--lake", str(lake), "--json"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    measured = run_measured(args, env=env, cwd=str(REPO))
    if measured.returncode != 0:
        raise SystemExit(f"{engine} run failed ({measured.returncode}):\n{measured.stderr[-3000:]}")
    result = json.loads(measured.stdout[measured.stdout.index("{"):])
    return {"wall_s": measured.wall_s, "run_s": result["duration_s"], "peak_mb": measured.peak_mb, "counts": result["counts"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--dedup", action="store_true", help="add the registered dedup operators to the graph")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="datahub-bench-engines-"))
    texts = base_texts(args.docs)
    per = -(-len(texts) // args.shards)
    for i in range(args.shards):
        write_jsonl(work / f"shard-{i:03d}.jsonl", texts[i * per:(i + 1) * per])
    mb = sum(len(t.encode()) for t in texts) / 2**20
    graph: dict = {
        "normalize": {"op": "normalize_text"},
        "gopher_quality": {"op": "gopher_quality", "after": ["normalize"]},
        "gopher_repetition": {"op": "gopher_repetition", "after": ["gopher_quality"]},
        "length": {"op": "length_filter", "after": ["gopher_repetition"], "params": {"min_words": 20}},
    }
    last = "length"
    if args.dedup:
        from datahub.operator import registered_operators

        for name in sorted(n for n, c in registered_operators().items() if c.__module__.startswith("operators.dedup")):
            graph[name] = {"op": name, "after": [last]}
            last = name
    graph["samples"] = {"sink": "samples", "after": [last]}
    job = work / "job.yaml"
    job.write_text(json.dumps({"name": "bench-engines", "lake": {"root": str(work / "lake")},
                               "inputs": [{"uri": str(work / "shard-*.jsonl")}], "graph": graph}))

    print(f"corpus: {len(texts)} docs, {mb:.1f} MB in {args.shards} shards; graph: {' -> '.join(k for k in graph)}")
    results = {}
    for engine in ("ray", "spark"):
        results[engine] = run_engine(engine, job, work / f"lake-{engine}")
        r = results[engine]
        print(f"{engine:6s} wall {r['wall_s']:7.2f} s  (run {r['run_s']:7.2f} s)  peak PSS {r['peak_mb']:8.1f} MB  "
              f"{len(texts) / r['wall_s']:8.0f} docs/s  samples {r['counts']['samples_written']}")
    from datahub.lake.lake import Lake

    ids = {e: sorted(Lake(work / f"lake-{e}").read("samples", columns=["sample_id"]).column("sample_id").to_pylist()) for e in results}
    print(f"same_samples: {ids['ray'] == ids['spark']}")
    print(f"time_ratio_spark_vs_ray: {results['spark']['wall_s'] / results['ray']['wall_s']:.2f}")
    print(f"run_time_ratio_spark_vs_ray: {results['spark']['run_s'] / results['ray']['run_s']:.2f}")
    print(f"peak_memory_ratio_spark_vs_ray: {results['spark']['peak_mb'] / results['ray']['peak_mb']:.2f}")


if __name__ == "__main__":
    main()

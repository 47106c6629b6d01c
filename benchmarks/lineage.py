"""One-sample lineage lookups in a lake of 1M samples: full scan vs file/row-group skipping vs Z-order.

Builds a synthetic lineage table with Lake.commit in a few commits shaped like the pipeline's
(two ingest runs of 500k samples with ingested + modified events, each commit sorted by
sample_id, then one release of all 1M), then times single-sample lookups.

    .venv/bin/python benchmarks/lineage.py [--samples 1000000] [--lookups 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake import Lake
from datahub.lake.tables import LINEAGE
from datahub.lineage import lineage_events, optimize_lineage


def synthetic_ids(n: int, seed: int) -> pa.Array:
    raw = np.random.default_rng(seed).bytes(16 * n).hex()
    return pa.array([raw[i : i + 32] for i in range(0, 32 * n, 32)], pa.string())


def events(ids: pa.Array, *, run_id: str, action: str, op: str, ref: str | None) -> pa.Table:
    n = len(ids)
    return pa.table({
        "sample_id": ids, "run_id": pa.array([run_id] * n), "op": pa.array([op] * n),
        "params_hash": pa.nulls(n, pa.string()), "action": pa.array([action] * n),
        "reason": pa.nulls(n, pa.string()), "ref": pa.array([ref] * n, pa.string()),
        "ts": pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
    }, schema=LINEAGE)


def build(lake: Lake, samples: int) -> pa.Array:
    half = samples // 2
    all_ids = []
    for run in range(2):
        ids = synthetic_ids(half, seed=run)
        all_ids.append(ids)
        table = pa.concat_tables([
            events(ids, run_id=f"bench-{run}", action="ingested", op="ingest@1", ref='{"source_uri": "s3://b/f.jsonl", "source_offset": 1}'),
            events(ids, run_id=f"bench-{run}", action="modified", op="normalize_text@1", ref=None),
        ]).sort_by([("sample_id", "ascending")])
        lake.commit("lineage", table, txn=f"bench-{run}")
    ids = pa.concat_arrays(all_ids)
    released = events(ids, run_id="release/r1", action="released", op="release@1", ref="r1")
    lake.commit("lineage", released.sort_by([("sample_id", "ascending")]), txn="release/r1")
    return ids


def time_lookups(fn, ids: list[str]) -> tuple[float, float]:
    times = []
    for sample_id in ids:
        t0 = time.perf_counter()
        rows = fn(sample_id)
        times.append((time.perf_counter() - t0) * 1000)
        assert rows.num_rows == 3, (sample_id, rows.num_rows)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=50)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="datahub-bench-lineage-")
    try:
        lake = Lake(os.path.join(root, "lake"))
        t0 = time.perf_counter()
        ids = build(lake, args.samples)
        rows = lake.table("lineage").get_add_actions(flatten=True).num_rows
        print(f"built lineage: {args.samples} samples, {3 * len(ids)} rows, {rows} files in {time.perf_counter() - t0:.1f}s")
        probe = [ids[int(i)].as_py() for i in np.random.default_rng(7).integers(0, len(ids), args.lookups)]

        def full_scan(sample_id: str) -> pa.Table:  # the peer: read the table, filter in memory
            table = lake.read("lineage")
            return table.filter(pc.equal(table.column("sample_id"), sample_id))

        full_p50, full_p95 = time_lookups(full_scan, probe[: max(5, args.lookups // 10)])
        print(f"full_scan:          p50 {full_p50:8.1f} ms  p95 {full_p95:8.1f} ms")
        skip_p50, skip_p95 = time_lookups(lambda s: lineage_events(lake, s), probe)
        print(f"skipping (sorted):  p50 {skip_p50:8.1f} ms  p95 {skip_p95:8.1f} ms")
        t0 = time.perf_counter()
        metrics = optimize_lineage(lake)
        print(f"optimize z_order:   {time.perf_counter() - t0:.1f}s, files {metrics['numFilesRemoved']} -> {metrics['numFilesAdded']}")
        z_p50, z_p95 = time_lookups(lambda s: lineage_events(lake, s), probe)
        print(f"skipping (z-order): p50 {z_p50:8.1f} ms  p95 {z_p95:8.1f} ms")
        print(f"speedup_vs_full_scan: {full_p50 / skip_p50:.1f} (sorted commits), {full_p50 / z_p50:.1f} (after optimize)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

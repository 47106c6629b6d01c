"""Loader throughput over the same shards in page cache: raw read vs webdataset vs ReleaseDataset.

    .venv/bin/python benchmarks/loader.py [--shards 8 --samples 2000 --text-bytes 6000] [--writer export|fixture]

The shards are written by the real export path (``datahub.export.export_table_version`` from a Delta
``samples`` table in a temporary lake to a cfs tier), or with ``--writer fixture`` by the loader tests'
shard writer (no Delta, faster to set up).

Prints MB/s (of shard bytes) and samples/s for one and two workers, then the ratios; the last
two lines are ``speedup_vs_webdataset`` and ``fraction_of_raw_read`` (one worker each).
ReleaseDataset yields decode="text" (UTF-8 decoded str) while webdataset yields undecoded bytes
(its fastest mode). The ratio lines compare like with like: webdataset neither shuffles nor
verifies, so they use ReleaseDataset(shuffle=False, verify=False, prefetch_shards=0); the run with
the defaults (block shuffle + sha256 per shard + prefetch threads) is printed too. Two-worker runs
hand out batches of 256 samples (both libraries), since per-sample DataLoader IPC dominates otherwise.

Every run builds a fresh ReleaseDataset, so nothing (tar index, verified checksums) carries over
between the timed repeats. ReleaseDataset memory-maps local shards (raw_read and webdataset copy them
with read()), then decodes every sample's text into a new str: the per-sample work is all done.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.loader.shards import write_release  # noqa: E402


def exported_release(root: Path, *, shards: int, samples: int, text_bytes: int) -> str:
    """A release written by ``datahub export`` to a cfs tier under ``root``; returns its manifest path."""
    import hashlib
    import json

    import pyarrow as pa

    from datahub.export import export_table_version
    from datahub.lake import Lake
    from datahub.storage import validate_storage_config

    count = shards * samples
    ids = [hashlib.sha256(f"doc {i}".encode()).hexdigest()[:32] for i in range(count)]
    texts = [(f"document {i} " * (text_bytes // 10 + 1))[:text_bytes] for i in range(count)]
    table = pa.table({"sample_id": ids, "text": texts, "source_uri": [f"file:///in/{i % 7}.jsonl" for i in range(count)],
                      "meta": [json.dumps({"n": i}) for i in range(count)]})
    lake = Lake(root / "lake")
    version = lake.commit("samples", table, txn="bench/1")
    storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(root / "cfs")}}}, source="bench")
    export_table_version(lake, table="samples", version=int(version or 0), release_name="bench-v1", tier="cfs",
                         storage=storage, shard_samples=samples)
    return str(root / "cfs" / "bench-v1" / "manifest.json")


def timed(run: Any, repeat: int = 2) -> tuple[float, int]:
    best, count = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = run() or 0
        best = min(best, time.perf_counter() - start)
    return best, count


def raw_read(paths: list[str]) -> int:
    for path in paths:
        with open(path, "rb") as handle:
            handle.read()
    return 0


def webdataset_iter(urls: list[str], workers: int) -> int:
    import webdataset
    from torch.utils.data import DataLoader

    dataset = webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)
    if workers == 0:
        return sum(1 for _ in dataset)
    batched = dataset.batched(256, collation_fn=None)
    return sum(len(batch) for batch in DataLoader(batched, batch_size=None, num_workers=workers))


LIKE_FOR_LIKE = {"shuffle": False, "verify": False, "prefetch_shards": 0}


def release_iter(manifest: str, workers: int, **settings: Any) -> int:
    from torch.utils.data import DataLoader

    from datahub.loader import ReleaseDataset

    if workers == 0:
        return sum(1 for _ in ReleaseDataset(manifest, rank=0, world_size=1, **settings))
    dataset = ReleaseDataset(manifest, rank=0, world_size=1, batch_size=256, **settings)
    return sum(len(batch) for batch in DataLoader(dataset, batch_size=None, num_workers=workers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="samples per shard")
    parser.add_argument("--text-bytes", type=int, default=6000, help="text size per sample")
    parser.add_argument("--writer", choices=["export", "fixture"], default="export", help="what writes the shards")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the one-worker runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        if args.writer == "export":
            manifest_path = exported_release(Path(root), shards=args.shards, samples=args.samples,
                                             text_bytes=args.text_bytes)
            manifest = json.loads(Path(manifest_path).read_text())
        else:
            manifest = write_release(Path(root), samples_per_shard=[args.samples] * args.shards,
                                     text_bytes=args.text_bytes)
            manifest_path = str(Path(root) / "manifest.json")
        paths = [shard["replicas"]["cfs"] for shard in manifest["shards"]]
        total_mb = sum(shard["size"] for shard in manifest["shards"]) / 1e6
        total_samples = manifest["num_samples"]
        raw_read(paths)  # into page cache
        results: dict[str, float] = {}

        def report(name: str, seconds: float) -> None:
            results[name] = seconds
            print(f"{name:<36} {total_mb / seconds:9.1f} MB/s {total_samples / seconds:12.0f} samples/s")

        def check(count: int) -> int:
            assert count == total_samples, count
            return count

        one_worker = {  # interleaved: each round times every reader once, so drifts in machine speed hit all alike
            "raw_read": lambda: raw_read(paths),
            "webdataset (1 worker)": lambda: check(webdataset_iter(paths, 0)),
            "ReleaseDataset (1 worker)": lambda: check(release_iter(manifest_path, 0, **LIKE_FOR_LIKE)),
            "ReleaseDataset defaults (1 worker)": lambda: check(release_iter(manifest_path, 0)),
        }
        rounds: list[dict[str, float]] = []
        for _ in range(args.rounds):
            rounds.append({name: timed(run, repeat=1)[0] for name, run in one_worker.items()})

        def median_ratio(slow: str, fast: str) -> float:
            return statistics.median(r[slow] / r[fast] for r in rounds)

        print(f"{args.shards} shards ({args.writer}), {total_samples} samples, {total_mb:.1f} MB, "
              f"text {args.text_bytes} B/sample; one worker: medians of {args.rounds} interleaved rounds")
        for name in one_worker:
            report(name, statistics.median(r[name] for r in rounds))
        for name, run in (("webdataset (2 workers)", lambda: webdataset_iter(paths, 2)),
                          ("ReleaseDataset (2 workers)", lambda: release_iter(manifest_path, 2, **LIKE_FOR_LIKE)),
                          ("ReleaseDataset defaults (2 workers)", lambda: release_iter(manifest_path, 2))):
            seconds, count = timed(run)
            report(name, seconds)
            check(count)
        speedup2 = results["webdataset (2 workers)"] / results["ReleaseDataset (2 workers)"]
        defaults2 = results["webdataset (2 workers)"] / results["ReleaseDataset defaults (2 workers)"]
        print(f"speedup_vs_webdataset_2_workers: {speedup2:.2f}")
        print(f"speedup_vs_webdataset_2_workers_with_shuffle_and_sha256: {defaults2:.2f}")
        print(f"speedup_vs_webdataset_with_shuffle_and_sha256: "
              f"{median_ratio('webdataset (1 worker)', 'ReleaseDataset defaults (1 worker)'):.2f}")
        print(f"speedup_vs_webdataset: {median_ratio('webdataset (1 worker)', 'ReleaseDataset (1 worker)'):.2f}")
        print(f"fraction_of_raw_read: {median_ratio('raw_read', 'ReleaseDataset (1 worker)'):.3f}")

if __name__ == "__main__":
    main()

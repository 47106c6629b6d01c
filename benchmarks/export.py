"""Export throughput vs peers measured in the same run on the same bytes.

local tier: datahub export (MB/s of shard bytes) vs webdataset.ShardWriter writing the same samples;
ceph tier:  datahub export to Ceph RGW vs a plain s3fs put of the very same shard bytes.
Run: .venv/bin/python benchmarks/export.py [--samples 20000] [--text-bytes 2000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from datahub.export import export_table_version  # noqa: E402
from datahub.lake import Lake  # noqa: E402
from datahub.storage import validate_storage_config  # noqa: E402


def _table(n: int, text_bytes: int) -> pa.Table:
    import hashlib

    base = "lorem ipsum dolor sit amet consectetur " * (text_bytes // 38 + 1)
    return pa.table({
        "sample_id": [hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(n)],
        "text": [f"{i} " + base[: text_bytes] for i in range(n)],
        "source_uri": ["file:///bench.jsonl"] * n,
        "source_offset": pa.array(range(n), pa.int64()),
        "meta": [json.dumps({"i": i}) for i in range(n)],
    })


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--text-bytes", type=int, default=2000)
    parser.add_argument("--shard-size", default="32MB")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dh-bench-export-"))
    try:
        lake = Lake(work / "lake")
        version = lake.commit("samples", _table(args.samples, args.text_bytes), txn="bench")
        storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(work / "cfs")}}})
        start = time.perf_counter()
        manifest = export_table_version(lake, table="samples", version=version, release_name="bench", tier="cfs",
                                        storage=storage, shard_size=args.shard_size)
        ours = time.perf_counter() - start
        total = sum(s.size for s in manifest.shards)

        import webdataset as wds

        rows = lake.read("samples", version=version).sort_by("sample_id").to_pylist()
        start = time.perf_counter()
        out = work / "wds"
        out.mkdir()
        with wds.ShardWriter(str(out / "bench-%06d.tar"), maxsize=int(32e6), maxcount=10**9, verbose=0) as sink:
            for r in rows:
                sink.write({"__key__": r["sample_id"], "txt": r["text"],
                            "json": {k: v for k, v in r.items() if k != "text"}})
        peer = time.perf_counter() - start
        peer_bytes = sum(p.stat().st_size for p in out.iterdir())
        print(f"samples: {args.samples}  shard bytes: {total}  shards: {len(manifest.shards)}")
        print(f"datahub_export_local_MBps: {total / ours / 1e6:.1f}")
        print(f"shardwriter_MBps: {peer_bytes / peer / 1e6:.1f}  (rows already in Python: {len(rows)})")
        print(f"ratio_vs_shardwriter: {(total / ours) / (peer_bytes / peer):.2f}")

        try:
            from tests.ceph import ceph_s3_config

            ceph = ceph_s3_config()
        except Exception as exc:  # noqa: BLE001 - report and skip the Ceph half
            ceph = None
            print(f"ceph: unavailable ({exc})")
        if ceph is None:
            print("ratio_vs_s3fs_put: n/a (no Ceph endpoint)")
            return
        import os

        os.environ["DH_BENCH_KEY"], os.environ["DH_BENCH_SECRET"] = ceph.key, ceph.secret
        bucket = ceph.new_bucket("bench-export")
        s3 = validate_storage_config({"tiers": {"ceph": {
            "kind": "ceph", "endpoint_url": ceph.endpoint_url, "bucket": bucket, "region": ceph.region,
            "credentials": {"key_env": "DH_BENCH_KEY", "secret_env": "DH_BENCH_SECRET"}}}})
        lake2 = Lake(work / "lake2")
        version2 = lake2.commit("samples", lake.read("samples", version=version), txn="bench")
        start = time.perf_counter()
        export_table_version(lake2, table="samples", version=version2, release_name="bench", tier="ceph",
                             storage=s3, shard_size=args.shard_size)
        ours_s3 = time.perf_counter() - start
        fs = ceph.filesystem()
        blobs = [Path(s.replicas["cfs"]).read_bytes() for s in manifest.shards]
        start = time.perf_counter()
        for i, blob in enumerate(blobs):
            fs.pipe_file(f"{bucket}/plain/{i:06d}.tar", blob)
        plain = time.perf_counter() - start
        print(f"datahub_export_ceph_MBps: {total / ours_s3 / 1e6:.1f}")
        print(f"s3fs_put_MBps: {total / plain / 1e6:.1f}")
        print(f"ratio_vs_s3fs_put: {plain / ours_s3:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Post-lake stages at two release sizes, 4x apart: peak memory of each command's whole process tree.

Builds two lakes of generated ~5 KB documents (S and L = 4 x S bytes of text), each with two releases
(``half``: the first half of the rows, ``full``: all of them), then runs the CLI a user runs, one command at a
time, sampling the summed PSS of its process tree (``benchmarks/_procmem.py``):
release create, qa, report, export (this process, then Ray with 2 workers, to another tier), tier apply (a copy
to a third tier), release diff, release redact, release merge (half + full, exact dedup, and near dedup), and a
release redact by an ids file of a quarter of the release's ids and as many others (``redact ids``).

Prints per command the peak on S and L and their ratio, then ``rss_growth_max: X`` (the largest L/S ratio),
``export_mb_s`` for the local and the Ray export on L, and ``export_vs_copy: Y`` = local export throughput /
a plain ``cp -r`` of the produced shard bytes to the same tier (a local directory here) followed by ``sync``
(the export fsyncs its shards), the median of three copies, each reading the shards from the page cache (they are
read once before the first: a cfs export writes them with O_DIRECT, so they are not cached after it).

    .venv/bin/python benchmarks/release_scale.py --small-mb 100 --shard-size 32MB [--doc-bytes 5000] [--skip-ray]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _procmem import run_measured  # noqa: E402

# --doc-bytes (passed to the lake-building child through the environment): short documents put per-row costs
# (the export plan's ~100 bytes per row, tar headers) in front of per-byte ones
DOC_BYTES = int(os.environ.get("DATAHUB_BENCH_DOC_BYTES", "5000"))
CHUNK_DOCS = 5000
# Parquet row groups of the generated lakes: a reader decodes a whole row group's column chunk, so both lakes get
# the same (the lake's default for streamed commits is 32,768 rows, ~160 MB of 5 KB texts; a small lake's commits
# would make smaller ones and flatter the growth ratio)
ROW_GROUP_ROWS = 4096


def _words(rng: np.random.Generator, count: int) -> np.ndarray:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = rng.integers(2, 10, count)
    return np.array([letters[rng.integers(0, 26, n)].tobytes().decode() for n in lengths])


def _chunk(rng: np.random.Generator, vocabulary: np.ndarray, start: int, count: int) -> pa.Table:
    """``count`` documents of about DOC_BYTES: Zipf-ish draws from the vocabulary (no two documents equal)."""
    ranks = np.minimum(rng.zipf(1.2, size=(count, DOC_BYTES // 6)), len(vocabulary)) - 1
    texts = [f"document {start + i}. " + " ".join(vocabulary[row].tolist()) for i, row in enumerate(ranks)]
    ids = [hashlib.sha256(t.encode()).hexdigest()[:32] for t in texts]
    n = len(texts)
    quality = pa.StructArray.from_arrays(
        [pa.array(["en"] * n), pa.array(rng.uniform(0.8, 1.0, n)), pa.array(rng.uniform(0.85, 1.0, n)),
         pa.array(rng.uniform(4, 6, n)), pa.array(rng.uniform(0, 0.05, n)), pa.array(rng.uniform(0.2, 0.5, n))],
        names=["language", "language_score", "gopher_alpha_words_ratio", "gopher_mean_word_length",
               "gopher_dup_line_frac", "fineweb_line_punct_ratio"])
    return pa.table({
        "sample_id": ids, "text": texts,
        "source_uri": [f"file:///corpus/part-{(start + i) % 16:02d}.jsonl" for i in range(n)],
        "source_offset": pa.array(np.arange(start, start + n), pa.int64()),
        "ingest_run_id": ["bench-ingest"] * n,
        "meta": [json.dumps({"n": start + i}) for i in range(n)],
        "quality": quality,
    })


def build_lake(root: Path, documents: int) -> None:
    """samples v0: the first half of the documents, v1: all of them (two commits, streamed in chunks)."""
    from datahub.lake import Lake

    lake = Lake(root)
    rng = np.random.default_rng(7)
    vocabulary = _words(rng, 30_000)
    half = documents // 2
    for txn, (begin, end) in (("bench/half", (0, half)), ("bench/rest", (half, documents))):
        chunks = (_chunk(np.random.default_rng(s), vocabulary, s, min(CHUNK_DOCS, end - s))
                  for s in range(begin, end, CHUNK_DOCS))
        lake.commit("samples", chunks, txn=txn, row_group_rows=ROW_GROUP_ROWS)


def write_ids_file(root: Path, path: Path) -> None:
    """A take-down list for ``release redact --ids-file``: every 4th sample id of the lake and as many ids of no
    sample, shuffled, one per line (it grows with the lake, as a real list would)."""
    from datahub.lake import Lake

    ids = Lake(root).read("samples", columns=["sample_id"]).column("sample_id").combine_chunks()
    taken = ids.take(pa.array(np.arange(0, len(ids), 4))).to_pylist()
    absent = [hashlib.sha256(f"absent {i}".encode()).hexdigest()[:32] for i in range(len(taken))]
    lines = np.array(taken + absent)
    np.random.default_rng(11).shuffle(lines)
    path.write_text("\n".join(lines.tolist()) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small-mb", type=float, default=100, help="text of the small lake (MB); the large is 4x")
    parser.add_argument("--shard-size", default="32MB")
    parser.add_argument("--doc-bytes", type=int, default=DOC_BYTES,
                        help="bytes of text per generated document (default 5000; e.g. 60 for a release of many "
                             "short documents, where per-row costs show)")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--only", help="comma-separated commands to measure (e.g. 'export,qa'); the ones they need "
                                       "(release create, export before tier apply) still run")
    parser.add_argument("--code", help="run the commands with datahub from this source tree (an older commit, "
                                       "e.g. `git archive REV | tar -x -C DIR`): the 'before' figures")
    allocator = parser.add_mutually_exclusive_group()
    allocator.add_argument("--system-allocator", action="store_true",
                           help="Arrow on malloc with fixed glibc mmap/trim thresholds set in each command's "
                                "environment (the CLI's default since datahub/allocator.py; for --code runs of "
                                "older commits)")
    allocator.add_argument("--arrow-allocator", action="store_true",
                           help="labelled variant: DATAHUB_ALLOCATOR=arrow, Arrow's own allocator (mimalloc/jemalloc, "
                                "keeps freed decode buffers) and glibc's default thresholds, as before the default")
    args = parser.parse_args()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONWARNINGS": "ignore"}
    if args.system_allocator:
        env.update({"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_MMAP_THRESHOLD_": "131072",
                    "MALLOC_TRIM_THRESHOLD_": "131072"})
    if args.arrow_allocator:
        env["DATAHUB_ALLOCATOR"] = "arrow"
    command_env = {**env, "PYTHONPATH": args.code} if args.code else env
    datahub = str(Path(sys.executable).parent / "datahub")
    doc_bytes = args.doc_bytes
    env["DATAHUB_BENCH_DOC_BYTES"] = str(doc_bytes)
    sizes = {"S": int(args.small_mb * 1e6 / doc_bytes), "L": int(4 * args.small_mb * 1e6 / doc_bytes)}
    peaks: dict[str, dict[str, float]] = {}
    export_mb_s: dict[str, float] = {}
    export_vs_copy = None
    with tempfile.TemporaryDirectory(prefix="datahub-bench-release-scale-") as tmp:
        for label, documents in sizes.items():
            work = Path(tmp) / label
            started = time.perf_counter()
            script = ("import sys; sys.path.insert(0, {!r}); from release_scale import build_lake, write_ids_file; "
                      "from pathlib import Path; build_lake(Path({!r}), {}); write_ids_file(Path({!r}), Path({!r})); "
                      "import os; os._exit(0)"
                      ).format(str(Path(__file__).resolve().parent), str(work / "lake"), documents, str(work / "lake"),
                               str(work / "ids.txt"))
            subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=str(REPO))
            print(f"{label}: {documents:,} documents (~{documents * doc_bytes / 1e6:,.0f} MB of text) built in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            storage = work / "storage.yaml"
            storage.write_text(json.dumps({"tiers": {t: {"kind": "cfs", "path": str(work / t)}
                                                     for t in ("cfs", "cfs2", "cfs3")}}))
            lake = str(work / "lake")
            commands: list[tuple[str, list[str]]] = [
                ("release create", ["release", "create", "half", "--lake", lake, "--version", "0"]),
                # the latest version: version 1 is build_lake's property commit (SET TBLPROPERTIES), not the rest
                ("release create", ["release", "create", "full", "--lake", lake]),
                ("qa", ["qa", lake, "--no-record"]),
                ("report", ["report", lake, "--out", str(work / "report")]),
                ("export", ["export", "full", "--lake", lake, "--tier", "cfs", "--storage", str(storage),
                            "--shard-size", args.shard_size]),
            ]
            if not args.skip_ray:
                commands.append(("export ray", ["export", "full", "--lake", lake, "--tier", "cfs2", "--storage",
                                                str(storage), "--shard-size", args.shard_size, "--engine", "ray",
                                                "--workers", "2"]))
            commands += [
                ("tier apply", ["tier", "apply", "--lake", lake, "--storage", str(storage), "--release", "full",
                                "--tiers", "cfs,cfs2,cfs3" if not args.skip_ray else "cfs,cfs3"]),
                ("release diff", ["release", "diff", "half", "full", "--lake", lake]),
                ("release redact", ["release", "redact", "redacted", "--from", "full", "--lake", lake,
                                    "--source", "file:///corpus/part-03.jsonl", "--reason", "benchmark take-down"]),
                ("release merge", ["release", "merge", "merged", "--from", "half", "--from", "full", "--lake", lake]),
                ("merge near", ["release", "merge", "merged-near", "--from", "half", "--from", "full", "--lake", lake,
                                "--dedup", "near"]),
                # last: a take-down list that grows with the release (write_ids_file); nothing above reads its release
                ("redact ids", ["release", "redact", "redacted-ids", "--from", "full", "--lake", lake, "--ids-file",
                                str(work / "ids.txt"), "--reason", "benchmark take-down list"]),
            ]
            if args.only:
                wanted = {n.strip() for n in args.only.split(",")} | {"release create"}
                if "tier apply" in wanted:
                    wanted.add("export")
                commands = [(n, c) for n, c in commands if n in wanted]
            for name, command in commands:
                measured = run_measured([datahub, *command], env=command_env, cwd=str(REPO))
                if measured.returncode != 0:
                    raise SystemExit(f"{label}: datahub {' '.join(command)} failed ({measured.returncode}):\n"
                                     f"{measured.stdout[-2000:]}\n{measured.stderr[-3000:]}")
                if command[:3] == ["release", "create", "full"]:  # the whole lake, not a half of it
                    shown = subprocess.run([datahub, "release", "show", "full", "--lake", lake, "--json"],
                                           env=command_env, cwd=str(REPO), capture_output=True, text=True, check=True)
                    if json.loads(shown.stdout)["row_count"] != documents:
                        raise SystemExit(f"{label}: release 'full' has {json.loads(shown.stdout)['row_count']} rows, "
                                         f"expected all {documents} documents")
                key = name if name != "release create" else "release create"
                peaks.setdefault(key, {})[label] = max(peaks.get(key, {}).get(label, 0.0), measured.peak_mb)
                print(f"  {label} {name:<15} wall {measured.wall_s:7.1f} s  peak PSS {measured.peak_mb:8.1f} MB  "
                      f"(driver process alone {measured.driver_peak_mb:.1f} MB)", flush=True)
                if name.startswith("export") and label == "L":
                    tier = work / ("cfs" if name == "export" else "cfs2") / "full"
                    shard_bytes = sum(p.stat().st_size for p in tier.glob("*.tar"))
                    export_mb_s["local" if name == "export" else "ray"] = shard_bytes / measured.wall_s / 1e6
                    if name == "export":
                        # the copies read the shards from the page cache whatever way the export wrote them (a
                        # cfs tier writes them with O_DIRECT, past the cache: a cold first copy would flatter the
                        # export); the baseline stays the fastest plain copy of the same bytes
                        for shard in sorted(tier.glob("*.tar")):
                            with shard.open("rb") as handle:
                                while handle.read(16 << 20):
                                    pass
                        copies = []  # this VM's copy speed varies 2-5x from run to run: the median of three
                        for attempt in range(3):
                            copy = work / "cfs" / f"plain-copy-{attempt}"
                            started = time.perf_counter()
                            subprocess.run(["cp", "-r", str(tier), str(copy)], check=True)
                            subprocess.run(["sync"], check=False)  # the export's shards are fsynced too
                            copies.append(shard_bytes / (time.perf_counter() - started) / 1e6)
                            shutil.rmtree(copy, ignore_errors=True)
                        copy_mb_s = statistics.median(copies)
                        export_vs_copy = export_mb_s["local"] / copy_mb_s
                        print(f"  L cp -r + sync of {shard_bytes / 1e6:.0f} MB of shards: {copy_mb_s:.1f} MB/s "
                              f"(median of {', '.join(f'{c:.0f}' for c in copies)})", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{'command':<16}{'S peak MB':>11}{'L peak MB':>11}{'L/S':>7}")
    growth = {}
    for name, by_size in peaks.items():
        growth[name] = by_size["L"] / by_size["S"]
        print(f"{name:<16}{by_size['S']:>11.0f}{by_size['L']:>11.0f}{growth[name]:>7.2f}")
    for engine, rate in export_mb_s.items():
        print(f"export_mb_s_{engine}: {rate:.1f}")
    if export_vs_copy is not None:
        print(f"export_vs_copy: {export_vs_copy:.2f}")
    print(f"rss_growth_max: {max(growth.values()):.2f} ({max(growth, key=lambda k: growth[k])})")


if __name__ == "__main__":
    main()

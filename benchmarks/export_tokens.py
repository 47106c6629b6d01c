"""Tokenized export vs a one-process Megatron-style tokenize-and-write loop, same texts, same tokenizer, same run.

datahub: `datahub export REL --tokenizer tok.json` as users run it (the CLI, defaults, a cfs tier), from a lake.
peer:    what Megatron-LM's tools/preprocess_data.py does in one process without its pool: read the same texts
         from the lake's Parquet, `encode_batch` each batch of 1024, append EOD, write .bin, write the .idx at the end.
Both run as subprocesses; peak memory is the whole process tree's PSS (benchmarks/_procmem.py), at two corpus
sizes 4x apart. The corpus is real man pages (benchmarks/_corpus.py), or with --doc-bytes N short synthetic documents
of about N bytes (benchmarks/release_scale.py's lake: many documents, where per-document costs show); the tokenizer a
byte-level BPE (vocab 8000) trained on the first 500 man pages in this run (no download).

Run: .venv/bin/python benchmarks/export_tokens.py [--docs 1500] [--doc-bytes 60] [--engine local|ray]
         [--file-tokens N] [--shuffle-seed S] [--code TREE --code TREE2 ...]
--code: run datahub from these source trees (e.g. `git archive REV | tar -x -C DIR`), one after the other on the same
lakes (A/B); default: this checkout.
Prints per size: tokens, tokens_per_s of both, ratio_vs_peer (datahub / peer; 1.0 = as fast as the bare loop),
peak_mb of both; then rss_growth (peak at 4x / peak at 1x) of both.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def prepare(work: Path, docs: int, doc_bytes: int) -> None:
    """A lake with ``docs`` man pages in 4 data files (or, with ``doc_bytes``, release_scale.py's lake of short
    documents, built in a child process: it reads the size from its environment), and the tokenizer."""
    import pyarrow as pa
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from _corpus import base_texts
    from datahub.lake import Lake

    texts = base_texts(500 if doc_bytes else docs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(texts[:500], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(work / "tok.json"))
    (work / "storage.yaml").write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {work / 'cfs'}\n")
    if doc_bytes:
        build = f"import os, sys; from release_scale import build_lake; build_lake({str(work / 'lake')!r}, {docs}); os._exit(0)"
        subprocess.run([sys.executable, "-c", build], check=True, cwd=REPO / "benchmarks",
                       env={**os.environ, "DATAHUB_BENCH_DOC_BYTES": str(doc_bytes)})
        return
    ids = [hashlib.sha256(f"{i}".encode()).hexdigest()[:32] for i in range(docs)]
    lake = Lake(work / "lake")
    quarter = -(-docs // 4)
    for part in range(4):
        rows = slice(part * quarter, min(docs, (part + 1) * quarter))
        lake.commit("samples", pa.table({"sample_id": ids[rows], "text": texts[rows]}), txn=f"bench/{part}")


def peer(work: Path) -> None:
    """The one-process loop (run in a subprocess): prints the token count."""
    import numpy as np
    import pyarrow.dataset as ds
    from tokenizers import Tokenizer

    from datahub.lake import Lake

    tokenizer = Tokenizer.from_file(str(work / "tok.json"))
    eod = tokenizer.token_to_id("<|endoftext|>")
    lengths: list[int] = []
    dataset: ds.Dataset = Lake(work / "lake").dataset("samples")
    with open(work / "peer.bin", "wb") as out:
        for batch in dataset.to_batches(columns=["text"], batch_size=1024):
            for encoding in tokenizer.encode_batch_fast(batch.column("text").to_pylist(), add_special_tokens=False):
                tokens = np.array(encoding.ids + [eod], dtype=np.uint16)
                out.write(tokens.tobytes())
                lengths.append(len(tokens))
    sizes = np.array(lengths, dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * 2)]).astype(np.int64)
    with open(work / "peer.idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sizes), len(sizes) + 1))
        out.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(sizes) + 1, dtype=np.int64).tobytes())
    print(int(sizes.sum()))


def _files_digest(folder: Path) -> str:
    """One sha256 over the token files' names and bytes (the trees of an A/B must write the same)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".bin", ".idx", ".ids")):
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()[:16]


def measure(docs: int, engine: str, codes: list[str | None], doc_bytes: int, export_args: list[str]) -> dict[str, Any]:
    """The peer once, then the export with each source tree in turn, on one lake."""
    import json

    from _procmem import run_measured

    work = Path(tempfile.mkdtemp(prefix="dh-bench-tokens-"))
    try:
        prepare(work, docs, doc_bytes)
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        theirs = run_measured([sys.executable, __file__, "--peer", str(work)], env=env)
        if theirs.returncode:
            raise SystemExit(f"peer failed: {theirs.stderr[-2000:]}")
        runs = []
        for code in codes:
            shutil.rmtree(work / "cfs", ignore_errors=True)
            shutil.rmtree(work / "lake" / "_exports", ignore_errors=True)  # the lake's token manifest: export again
            load = os.getloadavg()[0]
            ours = run_measured([str(Path(sys.executable).parent / "datahub"), "export", "bench", "--lake",
                                 str(work / "lake"), "--tier", "cfs", "--storage", str(work / "storage.yaml"),
                                 "--table", "samples", "--tokenizer", str(work / "tok.json"), "--engine", engine,
                                 "--json", *export_args], env={**env, "PYTHONPATH": code} if code else env, cwd=code)
            if ours.returncode:
                raise SystemExit(f"datahub export ({code or 'this tree'}) failed: {ours.stderr[-2000:]}")
            tokens = int(json.loads(ours.stdout)["num_tokens"])
            if int(theirs.stdout.split()[-1]) != tokens:
                raise SystemExit(f"token counts differ: datahub {tokens}, peer {theirs.stdout.split()[-1]}")
            runs.append({"code": code or "this tree", "s": ours.wall_s, "peak_mb": ours.peak_mb,
                         "digest": _files_digest(work / "cfs"), "load": f"{load:.2f} -> {os.getloadavg()[0]:.2f}"})
        return {"docs": docs, "tokens": tokens, "runs": runs, "peer_s": theirs.wall_s, "peer_peak_mb": theirs.peak_mb}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1500, help="documents at the small size (the large one is 4x)")
    parser.add_argument("--doc-bytes", type=int, default=0,
                        help="short synthetic documents of about this many bytes instead of man pages (e.g. 60 with "
                             "--docs 1000000)")
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    parser.add_argument("--code", action="append",
                        help="run datahub from this source tree; repeat for an A/B on the same lakes")
    parser.add_argument("--file-tokens", type=int, help="the export's --file-tokens (default: the CLI's)")
    parser.add_argument("--shuffle-seed", type=int, help="the export's --shuffle-seed (default: sample_id order)")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer(Path(args.peer))
        return
    start = time.perf_counter()
    codes: list[str | None] = [str(Path(c).resolve()) for c in args.code] if args.code else [None]
    export_args = [*(["--file-tokens", str(args.file_tokens)] if args.file_tokens else []),
                   *(["--shuffle-seed", str(args.shuffle_seed)] if args.shuffle_seed is not None else [])]
    results = [measure(args.docs, args.engine, codes, args.doc_bytes, export_args),
               measure(args.docs * 4, args.engine, codes, args.doc_bytes, export_args)]
    for r in results:
        theirs = r["tokens"] / r["peer_s"]
        print(f"docs: {r['docs']}  tokens: {r['tokens']}  engine: {args.engine}  {' '.join(export_args)}")
        print(f"  peer_tokens_per_s: {theirs:,.0f}  (wall {r['peer_s']:.1f} s)  peak_mb: {r['peer_peak_mb']:.0f}")
        for run in r["runs"]:
            ours = r["tokens"] / run["s"]
            print(f"  [{run['code']}] datahub_tokens_per_s: {ours:,.0f}  (wall {run['s']:.1f} s, CLI start-up "
                  f"included)  ratio_vs_peer: {ours / theirs:.2f}  peak_mb: {run['peak_mb']:.0f}  files: "
                  f"{run['digest']}  load: {run['load']}")
    small, large = results
    for s_run, l_run in zip(small["runs"], large["runs"]):
        print(f"rss_growth datahub [{s_run['code']}]: {l_run['peak_mb'] / s_run['peak_mb']:.2f}  "
              f"wall_growth: {l_run['s'] / s_run['s']:.2f}  (4x the documents)")
    print(f"rss_growth peer: {large['peer_peak_mb'] / small['peer_peak_mb']:.2f}")
    print(f"total_s: {time.perf_counter() - start:.0f}")


if __name__ == "__main__":
    main()

"""Tokenized export vs a one-process Megatron-style tokenize-and-write loop, same texts, same tokenizer, same run.

datahub: `datahub export REL --tokenizer tok.json` as users run it (the CLI, defaults, a cfs tier), from a lake.
peer:    what Megatron-LM's tools/preprocess_data.py does in one process without its pool: read the same texts
         from the lake's Parquet, `encode_batch` each batch of 1024, append EOD, write .bin, write the .idx at the end.
Both run as subprocesses; peak memory is the whole process tree's PSS (benchmarks/_procmem.py), at two corpus
sizes 4x apart. The corpus is real man pages (benchmarks/_corpus.py), the tokenizer a byte-level BPE (vocab 8000)
trained on the first 500 of them in this run (no download).

Run: .venv/bin/python benchmarks/export_tokens.py [--docs 1500] [--engine local|ray]
Prints per size: tokens, tokens_per_s of both, ratio_vs_peer (datahub / peer; 1.0 = as fast as the bare loop),
peak_mb of both; then rss_growth (peak at 4x / peak at 1x) of both.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def prepare(work: Path, docs: int) -> None:
    """A lake with ``docs`` man pages in 4 data files, and the tokenizer."""
    import pyarrow as pa
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from _corpus import base_texts
    from datahub.lake import Lake

    texts = base_texts(docs)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(texts[:500], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(work / "tok.json"))
    ids = [hashlib.sha256(f"{i}".encode()).hexdigest()[:32] for i in range(docs)]
    lake = Lake(work / "lake")
    quarter = -(-docs // 4)
    for part in range(4):
        rows = slice(part * quarter, min(docs, (part + 1) * quarter))
        lake.commit("samples", pa.table({"sample_id": ids[rows], "text": texts[rows]}), txn=f"bench/{part}")
    (work / "storage.yaml").write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {work / 'cfs'}\n")


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


def measure(docs: int, engine: str) -> dict[str, float]:
    import json

    from _procmem import run_measured

    work = Path(tempfile.mkdtemp(prefix="dh-bench-tokens-"))
    try:
        prepare(work, docs)
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        ours = run_measured([str(Path(sys.executable).parent / "datahub"), "export", "bench", "--lake", str(work / "lake"),
                             "--tier", "cfs", "--storage", str(work / "storage.yaml"), "--table", "samples",
                             "--tokenizer", str(work / "tok.json"), "--engine", engine, "--json"], env=env)
        if ours.returncode:
            raise SystemExit(f"datahub export failed: {ours.stderr[-2000:]}")
        manifest = json.loads(ours.stdout)
        theirs = run_measured([sys.executable, __file__, "--peer", str(work)], env=env)
        if theirs.returncode:
            raise SystemExit(f"peer failed: {theirs.stderr[-2000:]}")
        tokens = int(manifest["num_tokens"])
        if int(theirs.stdout.split()[-1]) != tokens:
            raise SystemExit(f"token counts differ: datahub {tokens}, peer {theirs.stdout.split()[-1]}")
        return {"docs": docs, "tokens": tokens, "datahub_s": ours.wall_s, "peer_s": theirs.wall_s,
                "datahub_peak_mb": ours.peak_mb, "peer_peak_mb": theirs.peak_mb}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1500, help="documents at the small size (the large one is 4x)")
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer(Path(args.peer))
        return
    start = time.perf_counter()
    results = [measure(args.docs, args.engine), measure(args.docs * 4, args.engine)]
    for r in results:
        ours, theirs = r["tokens"] / r["datahub_s"], r["tokens"] / r["peer_s"]
        print(f"docs: {r['docs']}  tokens: {r['tokens']}  engine: {args.engine}")
        print(f"  datahub_tokens_per_s: {ours:,.0f}  (wall {r['datahub_s']:.1f} s, CLI start-up included)")
        print(f"  peer_tokens_per_s: {theirs:,.0f}  (wall {r['peer_s']:.1f} s)")
        print(f"  ratio_vs_peer: {ours / theirs:.2f}")
        print(f"  peak_mb datahub: {r['datahub_peak_mb']:.0f}  peer: {r['peer_peak_mb']:.0f}")
    small, large = results
    print(f"rss_growth datahub: {large['datahub_peak_mb'] / small['datahub_peak_mb']:.2f}  "
          f"peer: {large['peer_peak_mb'] / small['peer_peak_mb']:.2f}  (4x the documents)")
    print(f"total_s: {time.perf_counter() - start:.0f}")


if __name__ == "__main__":
    main()

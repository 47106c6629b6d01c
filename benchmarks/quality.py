"""Throughput (docs/s) of each quality/cleaning operator, and of datatrove's equivalent filters
on the same documents. Run: .venv/bin/python benchmarks/quality.py [--docs N]

Documents: the demo corpus texts (stdlib docstrings + low-quality docs), repeated to N docs,
processed in Arrow batches of 2048 (our operators) or one Document at a time (datatrove).
datatrove's English word tokenizer needs spaCy (pip install spacy).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from datahub.operator import build_operator  # noqa: E402

OURS = ["length_filter", "gopher_quality", "gopher_repetition", "c4_quality", "fineweb_quality", "language_id",
        "redact_pii", "fix_unicode", "strip_boilerplate", "normalize_text"]
PEERS = {"gopher_quality": "GopherQualityFilter", "gopher_repetition": "GopherRepetitionFilter",
         "c4_quality": "C4QualityFilter", "fineweb_quality": "FineWebQualityFilter"}


def corpus(n: int) -> list[str]:
    texts = []
    for line in gzip.open(REPO / "data/demo/docs-a.jsonl.gz"):
        try:
            texts.append(json.loads(line)["text"])
        except (ValueError, KeyError):
            continue
    texts = [t for t in texts if 0 < len(t) < 100_000]
    return (texts * (n // len(texts) + 1))[:n]


def ours(name: str, texts: list[str], batch: int = 2048) -> float:
    op = build_operator(name, {"min_words": 20} if name == "length_filter" else {})
    tables = [pa.table({"text": texts[i:i + batch]}) for i in range(0, len(texts), batch)]
    op.process(tables[0].slice(0, 10))  # warm-up (langid model load)
    t0 = time.perf_counter()
    for t in tables:
        op.process(t)
    return len(texts) / (time.perf_counter() - t0)


def theirs(cls_name: str, texts: list[str]) -> float | None:
    try:
        from datatrove.data import Document
        from datatrove.pipeline import filters

        f = getattr(filters, cls_name)()
        f.filter(Document(text=texts[0], id="w"))  # warm-up (tokenizer load)
    except ImportError as exc:
        print(f"# datatrove {cls_name} unavailable: {exc}")
        return None
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    t0 = time.perf_counter()
    for d in docs:
        f.filter(d)
    return len(docs) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=4000)
    args = parser.parse_args()
    texts = corpus(args.docs)
    print(f"docs: {len(texts)}, mean chars: {sum(map(len, texts)) / len(texts):.0f}")
    print(f"{'operator':<20} {'docs/s':>10} {'datatrove docs/s':>17}")
    speedups = {}
    for name in OURS:
        rate = ours(name, texts)
        peer = theirs(PEERS[name], texts) if name in PEERS else None
        print(f"{name:<20} {rate:>10.0f} {'' if peer is None else f'{peer:.0f}':>17}")
        if peer:
            speedups[name] = rate / peer
    for name, ratio in speedups.items():
        print(f"speedup_vs_datatrove_{name}: {ratio:.1f}")


if __name__ == "__main__":
    main()

"""Regenerate the bundled demo corpus (deterministic): ``python data/demo/generate.py``.

Text comes from docstrings of the Python standard library (PSF License, which permits
redistribution), so the corpus is license-clean. It contains, on purpose:
exact duplicates, near duplicates (a few words edited), low-quality text, and broken
records (invalid JSON, invalid UTF-8, a truncated gzip, empty and oversize documents),
across JSONL (.jsonl.gz and .jsonl.zst), Parquet, plain text and WARC inputs.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import io
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = [
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools", "gzip", "hashlib", "heapq",
    "http.client", "inspect", "ipaddress", "itertools", "json", "logging", "mailbox", "mimetypes", "os",
    "pathlib", "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "shutil", "socket", "sqlite3",
    "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "turtle",
    "typing", "unittest", "urllib.parse", "uuid", "warnings", "wave", "weakref", "zipfile",
]


def documents() -> list[str]:
    seen: set[str] = set()
    docs: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing on this Python is fine
            continue
        objects = [module] + [obj for _, obj in sorted(vars(module).items()) if inspect.isclass(obj) or inspect.isfunction(obj)]
        for obj in objects:
            doc = inspect.getdoc(obj) or ""
            doc = re.sub(r"\n{3,}", "\n\n", doc).strip()
            words = doc.split()
            if len(words) >= 60 and doc not in seen and ">>>" not in doc:
                seen.add(doc)
                docs.append(doc)
    return docs


def near_duplicate(text: str, rng: random.Random, rate: float = 0.03) -> str:
    words = text.split(" ")
    for i in range(len(words)):
        if rng.random() < rate:
            words[i] = rng.choice(["data", "value", "object", "result", "item"])
    return " ".join(words)


def low_quality(rng: random.Random) -> list[str]:
    spam = " ".join(rng.choice(["buy", "cheap", "best", "deal", "click", "now"]) for _ in range(120))
    symbols = " ".join("#" * rng.randint(1, 6) + "!" for _ in range(100))
    bullets = "\n".join(f"* item {i} ..." for i in range(80))
    lorem = ("lorem ipsum " * 60).strip()
    return [spam, symbols, bullets, lorem]


def main() -> None:
    rng = random.Random(20261202)
    docs = documents()
    rng.shuffle(docs)
    base = docs[:190]
    part_a, part_b, part_c = base[:90], base[90:150], base[150:190]

    records_a = [{"text": t, "id": f"a{i}", "url": f"https://docs.example.org/a/{i}"} for i, t in enumerate(part_a)]
    # exact duplicates and near duplicates of earlier documents
    records_a += [{"text": part_a[i], "id": f"a-dup{i}"} for i in range(0, 10)]
    records_a += [{"text": near_duplicate(part_a[i], rng), "id": f"a-near{i}"} for i in range(10, 25)]
    records_a += [{"text": t, "id": f"lq{i}"} for i, t in enumerate(low_quality(rng))]
    lines = [json.dumps(r).encode() for r in records_a]
    lines.insert(17, b'{"text": "unterminated')  # invalid JSON
    lines.insert(40, b'{"text": "bad utf-8 \xff\xfe here"}')  # invalid UTF-8
    lines.insert(60, json.dumps({"text": "   \n  "}).encode())  # empty document
    lines.insert(80, json.dumps({"body": "no text field"}).encode())  # missing field
    lines.insert(90, json.dumps({"text": "x" * 300_000}).encode())  # oversize (demo limit 200 kB)
    (HERE / "docs-a.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines) + b"\n", mtime=0))

    import zstandard

    records_b = [{"text": t, "id": f"b{i}"} for i, t in enumerate(part_b)]
    records_b += [{"text": near_duplicate(part_a[i], rng, 0.02), "id": f"b-near{i}"} for i in range(25, 35)]
    payload = b"\n".join(json.dumps(r).encode() for r in records_b) + b"\n"
    (HERE / "docs-b.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=10).compress(payload))

    # a truncated gzip: the first records are readable, then the stream ends mid-member
    trunc = gzip.compress(b"\n".join(json.dumps({"text": t}).encode() for t in part_c[:8]) + b"\n", mtime=0)
    (HERE / "truncated.jsonl.gz").write_bytes(trunc[: int(len(trunc) * 0.6)])

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": part_c[8:30], "lang": ["en"] * 22, "rank": list(range(22))}), HERE / "docs-c.parquet")
    (HERE / "notes.txt").write_text(part_c[30] + "\n")

    write_warc(HERE / "pages.warc.gz", part_c[31:40] + [part_b[0]])


def write_warc(path: Path, texts: list[str]) -> None:
    out = io.BytesIO()
    for i, text in enumerate(texts):
        paragraphs = "".join(f"<p>{p}</p>" for p in text.split("\n\n"))
        html = (f"<html><head><title>Page {i}</title></head><body><nav><a href='/'>Home</a> | <a href='/about'>About</a></nav>"
                f"<article><h1>Page {i}</h1>{paragraphs}</article><footer>Copyright example.org</footer></body></html>")
        body = html.encode()
        http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        header = (
            "WARC/1.0\r\nWARC-Type: response\r\n"
            f"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-{i:012d}>\r\n"
            "WARC-Date: 2026-01-01T00:00:00Z\r\n"
            f"WARC-Target-URI: https://www.example.org/page/{i}\r\n"
            "Content-Type: application/http; msgtype=response\r\n"
            f"Content-Length: {len(http)}\r\n\r\n"
        ).encode()
        out.write(gzip.compress(header + http + b"\r\n\r\n", mtime=0))  # one gzip member per record
    path.write_bytes(out.getvalue())


if __name__ == "__main__":
    main()

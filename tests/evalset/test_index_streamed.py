"""The eval n-gram index is built from the ``evalsets`` table in batches (``load_index``): it read the latest
versions' text whole (``Lake.read``) and hashed every item at once, so a large benchmark's text, its normalized copy
and its word lists were all held together. The index is the same as the whole-table build's (refs, hashes, the first
item of a shared n-gram), and Arrow's peak while building it is a fraction of the text."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from datahub.lake import Lake
from operators.decontam.evalsets import EVALSETS, EVALSETS_TABLE, ROW_GROUP_ROWS, item_ref, latest_items, load_index
from operators.decontam.ngrams import NgramIndex

REPO = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(5000)]


def _commit_items(lake: Lake, name: str, version: int, texts: list[str], ids: list[str] | None = None) -> None:
    n = len(texts)
    rows = pa.table({
        "evalset": [name] * n, "version": pa.array([version] * n, pa.int64()),
        "item_id": ids or [f"i{k:07d}" for k in range(n)], "prompt": texts, "answer": [None] * n, "text": texts,
        "item_hash": [str(k) for k in range(n)], "source_uri": ["file:///x"] * n, "digest": [f"{name}{version}"] * n,
        "added": pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC"))}, schema=EVALSETS)
    lake.commit(EVALSETS_TABLE, rows, txn=f"evalset/{name}@{version}", row_group_rows=ROW_GROUP_ROWS)


def _whole_table_index(lake: Lake, ngram: int = 13) -> NgramIndex:
    """What ``load_index`` built before: every latest item's text at once, in (set, version, item id) order."""
    rows = latest_items(lake)
    refs = [item_ref(e, v, i) for e, v, i in zip(rows.column("evalset").to_pylist(), rows.column("version").to_pylist(),
                                                  rows.column("item_id").to_pylist())]
    return NgramIndex.build(rows.column("text"), refs, ngram=ngram)


def test_the_streamed_index_is_the_whole_table_build(tmp_path):
    lake = Lake(tmp_path / "lake")
    rng = random.Random(7)
    shared = " ".join(rng.choice(WORDS) for _ in range(20))  # in many items of both sets: names the first one
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) + (f" {shared}" if k % 7 == 0 else "")
             for k in range(300)]
    ids = [f"q{rng.randint(0, 10**9)}" for _ in texts]  # not in id order in the files
    _commit_items(lake, "zeta", 1, texts[:50])
    _commit_items(lake, "alpha", 1, texts[:10])  # an older version, left out
    _commit_items(lake, "alpha", 2, texts[100:] + ["", "?!"], ids[100:] + ["empty", "symbols"])
    for batch_rows in (1, 7, 4096):
        streamed, whole = load_index(lake, batch_rows=batch_rows), _whole_table_index(lake)
        assert streamed.refs == whole.refs
        assert np.array_equal(streamed.hashes, whole.hashes) and np.array_equal(streamed.items, whole.items)
    _commit_items(lake, "symbols", 1, ["?!", "..."])  # items, no n-gram
    assert load_index(lake, ["symbols"]).refs == ["symbols@1:i0000000", "symbols@1:i0000001"]
    assert len(load_index(lake, ["symbols"])) == 0
    only = load_index(lake, ["zeta"], batch_rows=16)
    assert only.refs == [f"zeta@1:i{k:07d}" for k in range(50)]


PEAK = """
import json, os, sys
import pyarrow as pa
from datahub.lake import Lake
from operators.decontam.evalsets import load_index
index = load_index(Lake(sys.argv[1]))
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "ngrams": len(index)}))
sys.stdout.flush()
os._exit(0)
"""


def test_building_the_index_holds_a_batch_of_text_not_the_whole_set(tmp_path):
    lake = Lake(tmp_path / "lake")
    words = np.array(WORDS)[np.random.default_rng(3).integers(0, len(WORDS), (100_000, 60))]
    texts = [" ".join(row) for row in words.tolist()]
    _commit_items(lake, "big", 1, texts)
    text_bytes = sum(len(t) for t in texts)  # ~35 MB
    out = subprocess.run([sys.executable, "-c", PEAK, str(lake.root)], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["ngrams"] > 100_000 * 40
    # the whole-table build held the text, its normalized copy and its word lists at once: ~4x the text in Arrow
    # (135 MB here); streamed: the read buffer and one batch's hashing, whatever the set's size (~12 MB)
    assert found["peak"] < min(24 * 2**20, text_bytes / 2), (found, text_bytes)

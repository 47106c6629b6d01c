"""release.merge through spilled sorted runs: the same rows, lineage and digests whether everything fits in one run
or is spilled in many, and the keep rule checked against a plain in-memory reading of it."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.lake import Lake, external_sort
from datahub.release import create_release, merge_releases
from datahub.release import freeze as freeze_module
from datahub.release import merge as merge_module
from datahub.release import merge_dedup
from datahub.sample_id import sample_id_of
from operators.dedup.exact import content_hash_hex
from tests.release.helpers import add_samples


def _lake(root) -> tuple[Lake, dict[str, list[str]]]:
    """Releases a-1, b-1, c-1 with shared samples, normalized copies (other ids), near copies, repeats inside one
    release and empty texts."""
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(2000)]

    def doc() -> str:
        return " ".join(rng.choice(vocab) for _ in range(50))

    a = [doc() for _ in range(300)]
    b = [doc() for _ in range(150)] + a[:30] + [t.upper() + "!" for t in a[30:60]]
    b += [" ".join(t.split()[:48] + ["edited", "end"]) for t in a[60:90]] + a[:10] + ["", " "]
    rng.shuffle(b)
    c = [doc() for _ in range(80)] + [t + " ." for t in b[:20]] + a[200:220]
    texts = {"a": a, "b": b, "c": c}
    lake = Lake(root)
    for name, rows in texts.items():
        add_samples(lake, rows, f"{name}.jsonl", table=name, run_id=f"{name}-aaaaaaaaaaaa")
        create_release(lake, f"{name}-1", table=name)
    return lake, texts


CASES = {
    "exact": dict(sources=["a-1", "b-1", "c-1"]),
    "exact-weighted": dict(sources=["c-1", "b-1", "a-1"], weights={"a-1": 0.5, "b-1": 0.3, "c-1": 0.2}, seed=3),
    "none-weighted": dict(sources=["b-1", "a-1"], dedup="none", weights={"a-1": 1.0, "b-1": 3.0}, seed=1),
    "near": dict(sources=["a-1", "b-1", "c-1"], dedup="near"),
    "near-unverified": dict(sources=["b-1", "a-1"], dedup="near", verify=False, threshold=0.7),
}


def _outcome(lake: Lake, name: str) -> dict:
    release = merge_releases(lake, name, **CASES[name])
    rows = lake.read(release.table, version=release.version)
    lineage = lake.read("lineage")
    mine = lineage.filter(pc.equal(lineage.column("run_id"), f"release/{name}")).drop_columns(["ts"])
    events = [(e["sample_id"], e["action"], e["reason"], e["ref"]) for e in mine.to_pylist()]
    assert [e[0] for e in events] == sorted(e[0] for e in events)  # released and dropped rows in one sorted stream
    return {"rows": rows.to_pylist(), "digest": release.digest, "details": release.details, "lineage": events}


@pytest.mark.parametrize("name", list(CASES))
def test_spilled_merge_equals_in_memory_merge(tmp_path, monkeypatch, name):
    lake, _ = _lake(tmp_path / "lake")
    whole = _outcome(lake, name)
    monkeypatch.setattr(external_sort, "RUN_ROWS", 37)  # every sort spills many runs, merged in groups
    monkeypatch.setattr(external_sort, "READ_ROWS", 8)
    monkeypatch.setattr(external_sort, "FAN_IN", 4)
    monkeypatch.setattr(merge_dedup, "EDGE_RUN_ROWS", 101)
    monkeypatch.setattr(merge_dedup, "MEMBER_RUN_ROWS", 5)
    monkeypatch.setattr(merge_dedup, "MEMBER_READ_ROWS", 2)
    monkeypatch.setattr(merge_dedup, "TEXT_BATCH_ROWS", 16)
    monkeypatch.setattr(merge_dedup, "ID_BATCH_ROWS", 16)
    monkeypatch.setattr(merge_dedup, "LINK_BATCH_PAIRS", 3)  # near: the union-find takes its linked rows in steps
    monkeypatch.setattr(merge_module, "DROP_RUN_ROWS", 7)  # the dropped rows' lineage spilled in many runs
    monkeypatch.setattr(merge_module, "DROP_READ_ROWS", 3)
    monkeypatch.setattr(freeze_module, "LINEAGE_CHUNK_ROWS", 50)  # drops merged into many released chunks
    spilled_lake, _ = _lake(tmp_path / "spilled")
    spilled = _outcome(spilled_lake, name)
    assert spilled == whole
    if name.startswith("near") or name.startswith("exact"):
        assert whole["details"]["duplicates_dropped"] > 0


def test_exact_merge_keeps_first_copy_of_each_id_then_each_key(tmp_path, monkeypatch):
    monkeypatch.setattr(external_sort, "RUN_ROWS", 50)
    monkeypatch.setattr(external_sort, "READ_ROWS", 16)
    lake, texts = _lake(tmp_path / "lake")
    order = [("a-1", texts["a"]), ("b-1", texts["b"]), ("c-1", texts["c"])]
    kept, dropped, seen_ids, key_owner = [], {}, set(), {}
    for release, rows in order:  # the keep rule read plainly: rows in --from order, then row order
        for text, key in zip(rows, content_hash_hex(pa.array(rows, pa.string())).to_pylist()):
            sample_id = sample_id_of(text)
            if sample_id in seen_ids:
                continue
            seen_ids.add(sample_id)
            if key in key_owner:
                dropped[sample_id] = key_owner[key]
            else:
                key_owner[key] = (sample_id, release)
                kept.append((sample_id, release))
    merged = merge_releases(lake, "exact", sources=[r for r, _ in order])
    rows = lake.read(merged.table, version=merged.version)
    assert list(zip(rows.column("sample_id").to_pylist(), rows.column("release_source").to_pylist())) == kept
    assert len(dropped) > 30 and merged.details["duplicates_dropped"] == len(dropped)
    lineage = lake.read("lineage").to_pylist()
    refs = {e["sample_id"]: e["ref"] for e in lineage if e["run_id"] == "release/exact" and e["action"] == "dropped"}
    assert {sid: (json.loads(ref)["dup_of"], json.loads(ref)["dup_release"]) for sid, ref in refs.items()} == dropped


@pytest.mark.parametrize("batch_pairs", [1, 7, 1 << 20])
def test_links_give_each_linked_row_its_components_smallest_row(monkeypatch, batch_pairs):
    """The near dedup's union-find over the linked rows only: the roots of a plain union-find over every row."""
    monkeypatch.setattr(merge_dedup, "LINK_BATCH_PAIRS", batch_pairs)
    rng = random.Random(5)
    rows = 5000
    pairs = [(rng.randrange(rows), rng.randrange(rows)) for _ in range(400)]
    pairs += [(i, i + 1) for i in range(4000, 4030)]  # one long chain
    parent = list(range(rows))

    def find(row: int) -> int:
        while parent[row] != row:
            row = parent[row]
        return row

    for a, b in pairs:
        low, high = sorted((find(a), find(b)))
        parent[high] = low
    links = merge_dedup._Links(np.int32)
    for start in range(0, len(pairs), 13):
        chunk = pairs[start:start + 13]
        links.link(np.array([a for a, _ in chunk]), np.array([b for _, b in chunk]))
    linked, roots = links.components()
    expected = sorted({r for pair in pairs for r in pair})
    assert linked.tolist() == expected
    assert roots.tolist() == [find(r) for r in expected]

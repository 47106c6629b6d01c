"""release.diff and release.merge (cross-release exact dedup, weighted deterministic sampling)."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import create_release, diff_releases, get_release, merge_releases, parse_weights
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


def test_diff_counts_overall_and_per_source(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["a", "b", "c"], "s1", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    # the next version: 'a' removed (overwrite), 'd' added from s2 and 'e' from s1
    lake.commit("samples", lake.read("samples").filter(pc.not_equal(lake.read("samples").column("text"), "a")),
                txn="rewrite", mode="overwrite")
    add_samples(lake, ["d"], "s2", run_id="job-bbbbbbbbbbbb")
    add_samples(lake, ["e"], "s1", run_id="job-cccccccccccc")
    create_release(lake, "r2")

    diff = diff_releases(lake, "r1", "r2", with_ids=True)
    assert (diff.added, diff.removed, diff.unchanged) == (2, 1, 2)
    assert diff.by_source == {"s1": {"added": 1, "removed": 1}, "s2": {"added": 1, "removed": 0}}
    assert diff.added_ids == sorted([sample_id_of("d"), sample_id_of("e")])
    assert diff.removed_ids == [sample_id_of("a")]
    back = diff_releases(lake, "r2", "r1")
    assert (back.added, back.removed) == (1, 2) and back.added_ids is None
    assert "added_ids" not in back.as_dict()


def _two_datasets(lake):
    web = [f"web page {i} about cooking" for i in range(10)]
    books = [f"book chapter {i} about sailing" for i in range(10)]
    books[0] = web[0]  # the same document in both datasets
    books[1] = "WEB page 1 about cooking!"  # equal to web[1] after dedup normalization
    add_samples(lake, web, "web.jsonl", table="web", run_id="web-aaaaaaaaaaaa")
    add_samples(lake, books, "books.jsonl", table="books", run_id="books-aaaaaaaaaaa")
    create_release(lake, "web-1", table="web")
    create_release(lake, "books-1", table="books")
    return web, books


def test_merge_dedups_across_releases_with_lineage(tmp_path):
    lake = Lake(tmp_path / "lake")
    web, books = _two_datasets(lake)
    merged = merge_releases(lake, "mix-1", sources=["web-1", "books-1"])
    assert merged.kind == "merge" and merged.parents == ("web-1", "books-1")
    assert merged.table == "release_mix-1" and merged.row_count == 18
    assert merged.details["duplicates_removed"] == 2
    assert set(merged.run_ids) == {"web-aaaaaaaaaaaa", "books-aaaaaaaaaaa"}

    rows = lake.read(merged.table, version=merged.version)
    origin = dict(zip(rows.column("sample_id").to_pylist(), rows.column("release_source").to_pylist()))
    assert origin[sample_id_of(web[1])] == "web-1"  # first --from wins
    assert sample_id_of(books[1]) not in origin
    assert sum(1 for r in origin.values() if r == "books-1") == 8

    lineage = lake.read("lineage")
    mine = lineage.filter(pc.equal(lineage.column("run_id"), "release/mix-1")).to_pylist()
    dropped = [e for e in mine if e["action"] == "dropped"]
    assert [e["sample_id"] for e in dropped] == [sample_id_of(books[1])]  # books[0] is the same sample, not a drop
    ref = json.loads(dropped[0]["ref"])
    assert ref["dup_of"] == sample_id_of(web[1]) and ref["dup_release"] == "web-1" and ref["from"] == "books-1"
    assert dropped[0]["reason"] == "merge_duplicate"
    released = {e["sample_id"]: e["reason"] for e in mine if e["action"] == "released"}
    assert len(released) == 18 and released[sample_id_of(books[5])] == "merged_from:books-1"

    # it is a frozen release like any other: immutable, diffable
    with pytest.raises(ReleaseError, match="already exists"):
        merge_releases(lake, "mix-1", sources=["web-1"])
    diff = diff_releases(lake, "web-1", "mix-1")
    assert (diff.added, diff.removed) == (8, 0)


def test_merge_weights_are_exact_and_seeded(tmp_path):
    lake = Lake(tmp_path / "lake")
    _two_datasets(lake)
    weights = parse_weights("web-1=0.75,books-1=0.25")
    a = merge_releases(lake, "w-a", sources=["web-1", "books-1"], weights=weights, seed=1)
    b = merge_releases(lake, "w-b", sources=["web-1", "books-1"], weights=weights, seed=1)
    # after dedup: web 10, books 8 -> N = min(10/0.75, 8/0.25) = 13.3 -> 10 web + 3 books
    assert a.details["quotas"] == {"web-1": 10, "books-1": 3} and a.row_count == 13
    assert a.digest == b.digest  # same seed, same rows
    picks = set()
    for seed in range(6):
        r = merge_releases(lake, f"w-s{seed}", sources=["web-1", "books-1"], weights=weights, seed=seed)
        rows = lake.read(r.table, version=r.version)
        books_rows = rows.filter(pc.equal(rows.column("release_source"), "books-1"))
        assert books_rows.num_rows == 3
        picks.add(tuple(sorted(books_rows.column("sample_id").to_pylist())))
    assert len(picks) > 1  # the seed changes the sample
    with pytest.raises(ReleaseError, match="missing"):
        merge_releases(lake, "w-bad", sources=["web-1", "books-1"], weights={"web-1": 1.0})
    with pytest.raises(ReleaseError, match="NAME=WEIGHT"):
        parse_weights("web-1:0.5")
    assert get_release(lake, "w-a").row_count == 13

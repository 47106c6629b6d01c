"""release.diff and release.merge (cross-release exact dedup, weighted deterministic sampling)."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.lake import Lake, external_sort
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


@pytest.mark.parametrize("run_rows", [65_536, 40])
def test_diff_of_spilled_sorted_runs_matches_set_arithmetic(tmp_path, monkeypatch, run_rows):
    monkeypatch.setattr(external_sort, "RUN_ROWS", run_rows)  # 40: each release's ids merged from many runs
    monkeypatch.setattr(external_sort, "READ_ROWS", 16)
    lake = Lake(tmp_path / "lake")
    add_samples(lake, [f"doc {i}" for i in range(0, 300)], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, [f"doc {i}" for i in range(0, 300, 3)], "b.jsonl", run_id="job-bbbbbbbbbbbb")  # repeats: first source a
    create_release(lake, "old")
    lake.commit("samples", lake.read("samples").filter(pc.less(lake.read("samples").column("source_offset"), 200)),
                txn="rewrite", mode="overwrite")
    add_samples(lake, [f"doc {i}" for i in range(250, 420)], "c.jsonl", run_id="job-cccccccccccc")
    create_release(lake, "new")

    def first_source(name):
        release = get_release(lake, name)
        rows = lake.read(release.table, version=release.version, columns=["sample_id", "source_uri"]).to_pylist()
        first = {}
        for row in rows:
            first.setdefault(row["sample_id"], row["source_uri"])
        return first

    old, new = first_source("old"), first_source("new")
    added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    expected_sources = {}
    for kind, ids, release in (("added", added, new), ("removed", removed, old)):
        for sample_id in ids:
            expected_sources.setdefault(release[sample_id], {"added": 0, "removed": 0})[kind] += 1
    diff = diff_releases(lake, "old", "new", with_ids=True)
    assert added and removed and diff.unchanged == len(set(old) & set(new)) > 0
    assert (diff.added_ids, diff.removed_ids) == (added, removed)
    assert (diff.added, diff.removed) == (len(added), len(removed))
    assert diff.by_source == dict(sorted(expected_sources.items()))


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


@pytest.mark.parametrize("text", ["web-1=nan,books-1=1", "web-1=inf,books-1=1", "web-1=-inf,books-1=1"])
def test_merge_refuses_non_finite_weights_before_the_dedup(tmp_path, monkeypatch, text):
    """NaN passed the `>= 0` and `not all 0` checks and the merge died after the dedup pass on `min()` of nothing."""
    import datahub.release.merge as merge

    lake = Lake(tmp_path / "lake")
    _two_datasets(lake)
    monkeypatch.setattr(merge, "_merge_rows", lambda *a, **k: pytest.fail("the dedup ran"))
    with pytest.raises(ReleaseError, match=r"--weights web-1=-?(nan|inf): weights must be finite numbers >= 0"):
        merge_releases(lake, "w-nan", sources=["web-1", "books-1"], weights=parse_weights(text))


def _near_datasets(lake):
    """Release news-1 and forum-1; forum holds near copies (last two words changed) of news 0-2,
    the very same sample as news 3, and a document sharing only its first half with news 4."""
    import random

    rng = random.Random(7)
    vocab = [f"term{i}" for i in range(3000)]
    news = [" ".join(rng.choice(vocab) for _ in range(60)) for _ in range(8)]
    forum = [" ".join(rng.choice(vocab) for _ in range(60)) for _ in range(6)]
    near = [" ".join(doc.split()[:58] + ["edited", "ending"]) for doc in news[:3]]
    half = " ".join(news[4].split()[:30] + forum[0].split()[:30])
    forum_texts = near + [news[3], half] + forum
    add_samples(lake, news, "news.jsonl", table="news", run_id="news-aaaaaaaaaaaa")
    add_samples(lake, forum_texts, "forum.jsonl", table="forum", run_id="forum-aaaaaaaaaa")
    create_release(lake, "news-1", table="news")
    create_release(lake, "forum-1", table="forum")
    return news, near, half


def _merge_drops(lake, name):
    lineage = lake.read("lineage")
    mine = lineage.filter(pc.and_(pc.equal(lineage.column("run_id"), f"release/{name}"),
                                  pc.equal(lineage.column("action"), "dropped")))
    return {e["sample_id"]: (e["reason"], json.loads(e["ref"])) for e in mine.to_pylist()}


def test_merge_near_dedup_reuses_minhash_and_records_lineage(tmp_path):
    lake = Lake(tmp_path / "lake")
    news, near, half = _near_datasets(lake)

    exact = merge_releases(lake, "mix-exact", sources=["news-1", "forum-1"])  # the default: near copies stay
    assert exact.row_count == 8 + 11 - 1 and _merge_drops(lake, "mix-exact") == {}
    assert exact.details["dedup"] == "exact" and exact.details["duplicates_removed"] == 1  # news[3], the same sample

    merged = merge_releases(lake, "mix-near", sources=["news-1", "forum-1"], dedup="near")
    assert merged.row_count == 8 + 11 - 1 - 3
    assert merged.details["dedup_method"] == "minhash" and merged.details["threshold"] == 0.8
    assert merged.details["duplicates_dropped"] == 3
    drops = _merge_drops(lake, "mix-near")
    assert set(drops) == {sample_id_of(t) for t in near}
    for copy, original in zip(near, news):
        reason, ref = drops[sample_id_of(copy)]
        assert reason == "merge_near_duplicate" and ref["method"] == "minhash"
        assert (ref["dup_of"], ref["dup_release"], ref["from"], ref["release"]) == (
            sample_id_of(original), "news-1", "forum-1", "mix-near")
        assert 0.8 <= ref["jaccard"] < 1.0 and ref["cluster_id"] in (sample_id_of(copy), sample_id_of(original))
    rows = lake.read(merged.table, version=merged.version)
    origin = dict(zip(rows.column("sample_id").to_pylist(), rows.column("release_source").to_pylist()))
    assert origin[sample_id_of(half)] == "forum-1" and origin[sample_id_of(news[3])] == "news-1"
    lineage = lake.read("lineage")
    released = lineage.filter(pc.and_(pc.equal(lineage.column("ref"), "mix-near"),
                                      pc.equal(lineage.column("action"), "released")))
    assert dict(zip(released.column("sample_id").to_pylist(), released.column("reason").to_pylist())) == {
        sid: f"merged_from:{src}" for sid, src in origin.items()}

    # the first --from wins: with forum first, the news originals are the ones dropped
    flipped = merge_releases(lake, "mix-flip", sources=["forum-1", "news-1"], dedup="near")
    drops = _merge_drops(lake, "mix-flip")
    assert flipped.row_count == merged.row_count and set(drops) == {sample_id_of(t) for t in news[:3]}
    assert {ref["dup_release"] for _, ref in drops.values()} == {"forum-1"}
    with pytest.raises(ReleaseError, match="--threshold 1.5"):
        merge_releases(lake, "mix-bad", sources=["news-1", "forum-1"], dedup="near", threshold=1.5)
    with pytest.raises(ReleaseError, match="expected exact, near or none"):
        merge_releases(lake, "mix-bad", sources=["news-1", "forum-1"], dedup="fuzzy")


def test_cli_merge_weights_dedup_modes(tmp_path):
    from typer.testing import CliRunner

    from datahub.cli.main import app

    lake = Lake(tmp_path / "lake")
    web, books = _two_datasets(lake)
    runner = CliRunner()

    def merge(*args):
        out = runner.invoke(app, ["release", "merge", *args, "--lake", lake.root, "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    weighted = merge("mix-w", "--from", "web-1", "--from", "books-1", "--weights", "web-1=0.7,books-1=0.3")
    # after exact dedup: web 10, books 8 -> N = min(10/0.7, 8/0.3) = 14.28 -> 10 web + 4 books
    assert weighted["details"]["quotas"] == {"web-1": 10, "books-1": 4} and weighted["row_count"] == 14
    assert weighted["details"]["weights"] == {"web-1": 0.7, "books-1": 0.3} and weighted["details"]["dedup"] == "exact"

    every = merge("mix-all", "--from", "web-1", "--from", "books-1", "--no-dedup")
    assert every["row_count"] == 20 and every["details"]["dedup"] == "none"
    assert every["details"]["duplicates_removed"] == 0
    rows = lake.read(every["table"], version=every["version"])
    assert rows.column("sample_id").to_pylist().count(sample_id_of(web[0])) == 2  # one row per input release

    near = merge("mix-near", "--from", "web-1", "--from", "books-1", "--dedup", "near", "--threshold", "0.9")
    assert near["details"]["dedup_method"] == "minhash" and near["details"]["threshold"] == 0.9
    assert near["row_count"] == 18  # the normalized copy is identical after normalization: Jaccard 1

    bad = runner.invoke(app, ["release", "merge", "mix-bad", "--from", "web-1", "--weights", "web-1:1",
                              "--lake", lake.root])
    assert isinstance(bad.exception, ReleaseError) and "NAME=WEIGHT" in str(bad.exception)
    wrong = runner.invoke(app, ["release", "merge", "mix-bad", "--from", "web-1", "--dedup", "fuzzy", "--lake", lake.root])
    assert wrong.exit_code == 2 and "fuzzy" in wrong.output  # refused by the option's choices

"""release redact in bounded memory: the removed ids sorted in spilled runs and looked up a partition at a time give
the same release, lineage and take-down rows as one partition."""

from __future__ import annotations

import shutil

import pyarrow.compute as pc

from datahub.lake import Lake
from datahub.release import create_release, get_release, redact, redacted_ids, releases_containing
from datahub.release.redact import SortedIds
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


def _lake(root) -> Lake:
    lake = Lake(root)
    add_samples(lake, [f"doc {i} of a" for i in range(30)], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, [f"doc {i} of book" for i in range(25)], "book.txt", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r1")
    add_samples(lake, [f"doc {i} of b" for i in range(20)] + ["doc 3 of book"], "b.jsonl",
                run_id="job-cccccccccccc")
    add_samples(lake, [f"late doc {i} of book" for i in range(7)], "book.txt", run_id="job-dddddddddddd")
    create_release(lake, "r2")
    return lake


def _outcome(lake: Lake, name: str) -> tuple:
    record = get_release(lake, name).as_dict()
    record.pop("created")
    rows = lake.read(record["table"], version=record["version"]).to_pylist()
    lineage = lake.read("lineage").drop_columns(["ts"])
    mine = lineage.filter(pc.equal(lineage.column("run_id"), f"release/{name}")).to_pylist()
    return record, rows, mine, redacted_ids(lake, name).to_pylist()


def test_redact_with_a_tiny_partition_budget_gives_what_one_partition_gives(tmp_path):
    one = _lake(tmp_path / "one")
    shutil.copytree(one.root, tmp_path / "many")
    many = Lake(tmp_path / "many")
    ids = [sample_id_of(f"doc {i} of a") for i in (1, 4, 9, 17)] + [sample_id_of("doc 2 of b"), "f" * 32]
    for lake, budget in ((one, 1 << 19), (many, 3)):  # 3 ids: several partitions, several spilled runs
        redact(lake, "r3", source="r2", source_uri="book.txt", sample_ids=ids, reason="take-down #7",
               partition_ids=budget)
    first, second = _outcome(one, "r3"), _outcome(many, "r3")
    assert first == second
    record, rows, lineage, taken = first
    # the book's 25 + 7 late rows, 4 of a, 1 of b ("f" * 32 is in no release)
    assert record["details"]["removed"] == 37 and len(taken) == 37
    assert record["details"]["contained_in"] == {"r1": 29, "r2": 37}
    assert len(rows) == 30 + 25 + 21 + 7 - 37
    assert sorted(r["sample_id"] for r in lineage if r["action"] == "dropped") == taken


def test_redact_of_a_source_alone_with_a_tiny_partition_budget_gives_what_one_partition_gives(tmp_path):
    one = _lake(tmp_path / "one")
    shutil.copytree(one.root, tmp_path / "many")
    many = Lake(tmp_path / "many")
    for lake, budget in ((one, 1 << 19), (many, 3)):  # no ids given: the removed ids are the named ones
        redact(lake, "r3", source="r2", source_uri="book.txt", reason="take-down #8", partition_ids=budget)
    first, second = _outcome(one, "r3"), _outcome(many, "r3")
    assert first == second
    record, rows, lineage, taken = first
    assert record["details"]["removed"] == 32 and len(taken) == 32  # the book's 25 + 7 late rows
    assert record["details"]["contained_in"] == {"r1": 25, "r2": 32}
    assert len(rows) == 30 + 25 + 21 + 7 - 32
    assert sorted(r["sample_id"] for r in lineage if r["action"] == "dropped") == taken


def test_releases_containing_counts_each_sample_once_whatever_the_partitions(tmp_path):
    lake = _lake(tmp_path / "lake")
    ids = [sample_id_of(f"doc {i} of b") for i in range(0, 20, 3)] + [sample_id_of("doc 3 of book"), "0" * 32]
    expected = {"r1": 25, "r2": 7 + 25 + 7}  # r1: the book's 25; r2: the ids from b, the book's 25 + 7 late ones
    for budget in (1, 2, 5, 1000):
        assert releases_containing(lake, sample_ids=ids, source_uri="book.txt", partition_ids=budget) == expected
        assert releases_containing(lake, sample_ids=ids, partition_ids=budget) == {"r1": 1, "r2": 8}
    assert releases_containing(lake, sample_ids=[], source_uri="book.txt") == {"r1": 25, "r2": 32}
    assert releases_containing(lake, sample_ids=[]) == {}


def test_sorted_ids_spill_and_read_back_in_order(tmp_path):
    import pyarrow as pa

    with SortedIds(run_rows=4) as ids:
        for part in (["d", "b", None, "a"], ["c", "b", "e"], ["a", "f", "g", "h", "i"]):
            ids.add(pa.array(part, pa.string()))
        ids.seal()
        assert ids.count == 9
        expected = list("abcdefghi")
        assert [v for block in ids.blocks() for v in block.to_pylist()] == expected
        assert [c.to_pylist() for c in ids.chunks(4)] == [expected[:4], expected[4:8], expected[8:]]
        assert [v for c in ids.chunks(100) for v in c.to_pylist()] == expected  # read again
        # where each chunk's share of the id range begins (blocks of 4 ids: bounds inside and at a block's start)
        assert [b.as_py() for b in ids.bounds(4)] == ["e", "i"]
        assert [b.as_py() for b in ids.bounds(3)] == ["d", "g"]
        assert [b.as_py() for b in ids.bounds(1)] == expected[1:]
        assert ids.bounds(9) == [] and ids.bounds(100) == []

"""datahub.release.lookup: a take-down list of many partitions is looked up in one read of the release (its ids split
by the partitions' id ranges), and what it takes is what a brute-force set computed here takes."""

from __future__ import annotations

import bisect
import tempfile

import numpy as np
import pyarrow as pa
import pytest

from datahub.lake import Lake, external_sort
from datahub.release import create_release, redact, redacted_ids, releases_containing
from datahub.release import exclude, lookup
from datahub.release.lookup import RangeSplit, SortedIds, partition_of, taken_rows
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


def _lake(root) -> Lake:
    """r1: 60 rows of a.jsonl and 40 of book.txt; r2: r1 and 30 rows of b.jsonl (one, "doc 7 of a", a second time)."""
    lake = Lake(root)
    add_samples(lake, [f"doc {i} of a" for i in range(60)], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, [f"doc {i} of book" for i in range(40)], "book.txt", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r1")
    add_samples(lake, [f"doc {i} of b" for i in range(29)] + ["doc 7 of a"], "b.jsonl", run_id="job-cccccccccccc")
    create_release(lake, "r2")
    return lake


def _given() -> list[str]:
    """Every third id of a, every fifth of b, one of the book, ids of no sample (and repeats), shuffled."""
    ids = ([sample_id_of(f"doc {i} of a") for i in range(0, 60, 3)] + [sample_id_of(f"doc {i} of b")
                                                                        for i in range(0, 29, 5)]
           + [sample_id_of("doc 11 of book"), sample_id_of("doc 7 of a")] + [f"{i:032x}" for i in range(25)]
           + ["", "zzz", "0"])
    np.random.default_rng(3).shuffle(ids)
    return ids


def _rows(lake: Lake, release: str) -> list[dict]:
    from datahub.release import get_release

    record = get_release(lake, release)
    return lake.read(record.table, version=record.version).select(["sample_id", "source_uri"]).to_pylist()


@pytest.fixture
def small_spill(monkeypatch):
    """Spilled runs and split blocks of a few rows: every partition gets many batches of the release's rows."""
    monkeypatch.setattr(lookup, "SPLIT_ROWS", 7)
    monkeypatch.setattr(external_sort, "RUN_ROWS", 5)
    monkeypatch.setattr(external_sort, "READ_ROWS", 3)
    monkeypatch.setattr(external_sort, "FAN_IN", 3)


def test_partition_of_is_the_count_of_bounds_at_or_below_each_id():
    rng = np.random.default_rng(5)
    words = [rng.bytes(int(rng.integers(0, 4))).hex() for _ in range(400)] + [None, None]
    for count in (0, 1, 2, 3, 7, 16, 31):
        bounds = sorted(set(w for w in words[:count * 3] if w is not None))[:count]
        found = partition_of(pa.array(words, pa.string()), pa.array(bounds, pa.string()))
        expected = [bisect.bisect_right(bounds, w) if w is not None else len(bounds) for w in words]
        assert found.tolist() == expected


def test_range_split_gives_each_row_once_to_the_partition_whose_range_holds_it(tmp_path, small_spill):
    lake = _lake(tmp_path / "lake")
    dataset = lake.dataset("samples")
    all_rows = dataset.to_table(columns=["sample_id", "source_uri"]).to_pylist()
    bounds = [pa.scalar(b) for b in sorted({r["sample_id"] for r in all_rows})[10::17]]
    edges = [b.as_py() for b in bounds]
    with RangeSplit(dataset, bounds, sources={"book.txt": 4, "nowhere": 9}) as split:
        assert split.partitions == len(bounds) + 1 > 5
        seen: list[int] = []
        for index in range(split.partitions):
            rows: list[int] = []
            sizes: list[int] = []
            for scanned in split.rows(index, lookup_rows=4):
                sizes.append(len(scanned.ids))
                rows += scanned.rows.tolist()
                for sample_id, row, code in zip(scanned.ids.to_pylist(), scanned.rows.tolist(),
                                                scanned.by_source.to_pylist()):
                    assert sample_id == all_rows[row]["sample_id"]
                    assert bisect.bisect_right(edges, sample_id) == index
                    assert code == (4 if all_rows[row]["source_uri"] == "book.txt" else None)
            assert rows == sorted(rows)  # scan order within a partition
            assert all(size >= 4 for size in sizes[:-1])  # lookup calls of at least lookup_rows rows
            seen += rows
        assert sorted(seen) == list(range(len(all_rows)))


@pytest.mark.parametrize("partition_ids", [1, 4, 1000])
def test_taken_rows_take_what_a_set_of_the_ids_takes(tmp_path, small_spill, partition_ids):
    lake = _lake(tmp_path / "lake")
    dataset = lake.dataset("samples")
    all_rows = dataset.to_table(columns=["sample_id", "source_uri"]).to_pylist()
    given = _given()
    codes = {sample_id: index % 3 for index, sample_id in enumerate(sorted(set(given)))}
    with SortedIds(codes=True, run_rows=partition_ids) as ids:
        ids.add(pa.array(given, pa.string()), pa.array([codes[i] for i in given], pa.int32()))
        ids.seal()
        found = {}
        for taken in taken_rows(dataset, ids, partition_ids=partition_ids, sources={"book.txt": 7}):
            for sample_id, row, code in zip(taken.ids.to_pylist(), taken.rows.tolist(), taken.codes.to_pylist()):
                assert row not in found
                found[row] = (sample_id, code)
    expected = {row: (r["sample_id"], codes.get(r["sample_id"], 7)) for row, r in enumerate(all_rows)
                if r["sample_id"] in codes or r["source_uri"] == "book.txt"}
    assert found == expected
    assert len({c for _, c in found.values()}) == 4


@pytest.mark.parametrize("partition_ids", [2, 5, 1 << 18])
def test_redact_of_many_partitions_takes_what_a_set_of_the_ids_takes(tmp_path, small_spill, partition_ids):
    lake = _lake(tmp_path / "lake")
    given = _given()
    path = tmp_path / "ids.txt"
    path.write_text("\n".join(given) + "\n")
    before = _rows(lake, "r2")
    record = redact(lake, "r3", source="r2", ids_files=[str(path)], source_uri="book.txt", reason="take-down #9",
                    partition_ids=partition_ids)
    named = set(given) - {""}
    gone = [r for r in before if r["sample_id"] in named or r["source_uri"] == "book.txt"]
    assert _rows(lake, "r3") == [r for r in before if r not in gone]
    assert record.details["removed"] == len(gone)
    assert record.details["requested_ids"] == len(named)
    assert redacted_ids(lake, "r3").to_pylist() == sorted({r["sample_id"] for r in gone})
    held = {name: {r["sample_id"] for r in _rows(lake, name)} for name in ("r1", "r2")}
    in_book = {r["sample_id"] for r in before if r["source_uri"] == "book.txt"}
    assert record.details["contained_in"] == {name: len(ids & (named | in_book)) for name, ids in held.items()}
    assert releases_containing(lake, sample_ids=sorted(named), partition_ids=partition_ids) == {
        name: len(ids & named) for name, ids in held.items() if ids & named}


@pytest.mark.parametrize("partition_ids", [1, 3, 1 << 18])
def test_create_after_redactions_of_many_partitions_leaves_out_what_a_set_leaves_out(tmp_path, small_spill,
                                                                                     monkeypatch, partition_ids):
    lake = _lake(tmp_path / "lake")
    given = _given()
    redact(lake, "r3", source="r2", sample_ids=given[:20], reason="PII")
    redact(lake, "r4", source="r3", sample_ids=given[20:], source_uri="book.txt", reason="copyright")
    add_samples(lake, ["doc 3 of a", "doc 5 of book", "doc 99 of z"], "z.jsonl", run_id="job-dddddddddddd")
    monkeypatch.setattr(exclude, "PARTITION_IDS", partition_ids)
    rows = lake.read("samples", columns=["sample_id", "source_uri"]).to_pylist()  # the version r5 freezes
    assert len(rows) == 133
    taken = set(redacted_ids(lake, "r3").to_pylist()) | set(redacted_ids(lake, "r4").to_pylist())
    record = create_release(lake, "r5")
    kept = [r for r in rows if r["sample_id"] not in taken and r["source_uri"] != "book.txt"]
    assert _rows(lake, "r5") == kept
    assert record.details["redacted_excluded"] == {"rows": len(rows) - len(kept), "by": ["r3", "r4"]}


def test_the_release_is_read_once_whatever_the_number_of_partitions(tmp_path, monkeypatch):
    """Failed before: the release's ids were read once per partition of the given ids (4 reads at 3 ids a
    partition for these 10 ids)."""
    lake = _lake(tmp_path / "lake")
    reads: list[object] = []
    real = lookup.scan_batches

    def counted(dataset, **kwargs):
        if kwargs.get("columns") is not None:  # the narrow reads of ids (and sources), not the rows kept
            reads.append(kwargs["columns"])
        return real(dataset, **kwargs)

    monkeypatch.setattr(lookup, "scan_batches", counted)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the spills go
    ids = [sample_id_of(f"doc {i} of a") for i in range(10)]
    redact(lake, "r3", source="r2", sample_ids=ids, reason="take-down #10", partition_ids=3)
    assert list(scratch.iterdir()) == []  # the ids, the split rows and the runs removed
    # the source release once in the lookup, then r1 and r2 once each for contained_in
    assert len(reads) == 3
    assert len(_rows(lake, "r3")) == 130 - 11  # "doc 7 of a" twice


def test_releases_containing_reads_the_partition_bounds_of_the_ids_once(tmp_path, small_spill, monkeypatch):
    """The bounds of the given ids' partitions are read from their spill once, not once per release: the spill is
    read once for the bounds and once per release for its partitions' ids (before: twice per release)."""
    lake = _lake(tmp_path / "lake")
    create_release(lake, "r3")  # a third release of the same version
    reads = []
    real_tables = SortedIds._tables

    def counted(self):
        reads.append(self)
        return real_tables(self)

    monkeypatch.setattr(SortedIds, "_tables", counted)
    named = [i for i in _given() if i]
    with SortedIds(run_rows=4) as ids:
        ids.add(pa.array(named))
        ids.seal()
        reads.clear()
        found = releases_containing(lake, sample_ids=ids, partition_ids=3)
        assert [r is ids for r in reads] == [True] * 4  # 1 for the bounds, 1 per release
        held = {name: {r["sample_id"] for r in _rows(lake, name)} for name in ("r1", "r2", "r3")}
        assert found == {name: len(rows & set(named)) for name, rows in held.items()}
        assert ids.bounds(3) == ids.bounds(3) and len(ids.bounds(3)) == (ids.count - 1) // 3

"""release redact in bounded memory: the removed ids sorted in spilled runs and looked up a partition at a time give
the same release, lineage and take-down rows as one partition."""

from __future__ import annotations

import shutil

from datahub.lake import Lake
from datahub.release import create_release, redact, redacted_ids, releases_containing
from datahub.release.redact import SortedIds
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples, release_outcome


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
    return (*release_outcome(lake, name), redacted_ids(lake, name).to_pylist())


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


def _python_ids(path) -> list[str]:
    """How --ids-file was read before it was streamed: Python text lines, cut at '#', stripped, blank ones out."""
    with open(path, encoding="utf-8") as handle:
        return [line.split("#", 1)[0].strip() for line in handle if line.split("#", 1)[0].strip()]


def test_ids_file_read_a_block_at_a_time_gives_the_ids_of_python_text_lines(tmp_path):
    from datahub.release.redact import ids_file_chunks

    path = tmp_path / "ids.txt"
    # CRLF, a lone CR, comments, blank and whitespace-only lines, tabs, unicode spaces, a BOM, no final newline
    path.write_bytes("\ufeffaaa\r\nbbb # the second\n\n  \t\n# a comment line\nccc\rddd\u2003\n\u00a0eee\u3000\r\n"
                     "fff#gg\r\r\n   h h  \n\x1cjjj\x1f\nlast".encode())
    expected = _python_ids(path)
    assert expected[1:] == ["bbb", "ccc", "ddd", "eee", "fff", "h h", "jjj", "last"]
    for block_bytes in (1, 2, 3, 5, 8, 1 << 20):  # lines (and CRLF) cut across blocks
        assert [i for chunk in ids_file_chunks(str(path), block_bytes=block_bytes) for i in chunk.to_pylist()] \
            == expected
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n\n")
    assert [len(c) for c in ids_file_chunks(str(empty))] in ([], [0])


def test_ids_file_errors_name_the_file(tmp_path):
    import pytest

    from datahub.errors import ReleaseError
    from datahub.release.redact import read_ids_file

    with pytest.raises(ReleaseError, match="cannot read"):
        read_ids_file(str(tmp_path / "missing.txt"))
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"aaa\nb\xe9b\n")
    with pytest.raises(ReleaseError, match=r"not UTF-8 text .* at byte 5"):
        read_ids_file(str(bad))


def test_ids_sha256_of_spilled_blocks_is_the_sha256_of_the_sorted_ids_joined(tmp_path):
    """A take-down's params name its ids by the sha256 of the sorted distinct ids joined by newlines (as before they
    were streamed): a re-run of a crashed redact must find the same params."""
    import hashlib

    import pyarrow as pa

    from datahub.release.redact import _ids_sha256

    for ids in ([], ["b"], ["d", "a", "c", "a", "b", "", "e", "f", "é", "g"]):
        with SortedIds(run_rows=3) as spilled:
            spilled.add(pa.array(ids, pa.string()))
            spilled.seal()
            assert _ids_sha256(spilled) == hashlib.sha256("\n".join(sorted(set(ids))).encode()).hexdigest()


def test_redact_by_an_ids_file_gives_what_the_same_ids_given_as_a_list_give(tmp_path):
    one = _lake(tmp_path / "one")
    shutil.copytree(one.root, tmp_path / "many")
    many = Lake(tmp_path / "many")
    ids = [sample_id_of(f"doc {i} of a") for i in (1, 4, 9, 17)] + [sample_id_of("doc 2 of b"), "f" * 32]
    path = tmp_path / "ids.txt"
    path.write_text("# take-down #7\n" + "\n".join(f"  {i}  # why" for i in ids + ids[:2]) + "\n")
    redact(one, "r3", source="r2", source_uri="book.txt", sample_ids=ids, reason="take-down #7")
    redact(many, "r3", source="r2", source_uri="book.txt", sample_ids=ids[:1], ids_files=[str(path)],
           reason="take-down #7", partition_ids=2)
    assert _outcome(one, "r3") == _outcome(many, "r3")
    assert _outcome(one, "r3")[0]["details"]["requested_ids"] == len(ids)

"""`datahub lineage` when the lookup finds nothing: one line that says what to check, exit 1. Before, an unknown
--source printed "F: 0 records: " and an empty table (read as a file without records) before the error, and a
shortened sample id (12 characters copied from a narrow table) got the same "check the id" as a well-formed one."""

from __future__ import annotations

from tests.cli.conftest import datahub


def test_an_unknown_source_prints_one_line_and_no_empty_table(small_lake):
    missing = datahub("lineage", "--source", str(small_lake.parent / "b.jsonl"), "--lake", str(small_lake))
    assert missing.returncode == 1, missing.stderr
    assert missing.stdout == "", missing.stdout
    assert "no record of" in missing.stderr and "Traceback" not in missing.stderr


def test_a_shortened_sample_id_is_said_to_be_one(small_lake):
    from datahub.lake import Lake

    known = Lake(str(small_lake)).read("samples", columns=["sample_id"]).column("sample_id")[0].as_py()
    assert datahub("lineage", known, "--lake", str(small_lake)).returncode == 0
    short = datahub("lineage", known[:12], "--lake", str(small_lake))
    assert short.returncode == 1
    assert "a sample id is 32 lower-case hexadecimal characters, this one has 12 characters" in short.stdout, short.stdout
    upper = datahub("lineage", known.upper(), "--lake", str(small_lake))
    assert upper.returncode == 1 and "this one has 32 characters with" in upper.stdout, upper.stdout
    other = datahub("lineage", "0" * 32, "--lake", str(small_lake))
    assert other.returncode == 1 and "check the id and the lake" in other.stdout, other.stdout

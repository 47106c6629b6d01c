"""release.create: frozen versions, content digest, immutable names, QA gating, released lineage."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, release_digest
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_qa_result, add_samples


def test_create_freezes_version_with_digest_and_lineage(tmp_path):
    lake = Lake(tmp_path / "lake")
    texts = [f"document number {i}" for i in range(5)]
    v0 = add_samples(lake, texts, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    release = create_release(lake, "corpus-1", creator="alice")
    add_samples(lake, ["a later document"], "s3://bucket/b.jsonl", run_id="job-bbbbbbbbbbbb")

    again = get_release(lake, "corpus-1")
    assert (again.table, again.version, again.row_count) == ("samples", v0, 5)
    assert again.creator == "alice" and again.run_ids == ("job-aaaaaaaaaaaa",) and again.jobs == ("job",)
    assert again.schema_version == "1" and again.qa_status == "no_qa_results"
    # the frozen version still reads 5 rows after the table moved on
    assert lake.read(again.table, version=again.version).num_rows == 5
    assert lake.read("samples").num_rows == 6

    ids = [sample_id_of(t) for t in texts]
    shuffled = ids[:]
    random.Random(3).shuffle(shuffled)
    assert release.digest == release_digest(pa.array(shuffled))  # order-independent
    assert release.digest != release_digest(pa.array(ids[:4]))  # any removal changes it
    assert release.digest.startswith("sum128:") and len(release.digest) == len("sum128:") + 32
    expected = sum(int(i, 16) for i in ids) % 2**128
    assert release.digest == f"sum128:{expected:032x}"

    lineage = lake.read("lineage")
    released = lineage.filter(pc.equal(lineage.column("action"), "released"))
    assert sorted(released.column("sample_id").to_pylist()) == sorted(ids)
    assert set(released.column("ref").to_pylist()) == {"corpus-1"}
    assert set(released.column("run_id").to_pylist()) == {"release/corpus-1"}


def test_names_are_immutable(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["one", "two"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    add_samples(lake, ["three"], "a.jsonl", run_id="job-bbbbbbbbbbbb")
    with pytest.raises(ReleaseError, match="already exists.*immutable"):
        create_release(lake, "r1")
    assert get_release(lake, "r1").row_count == 2  # unchanged
    assert [r.name for r in list_releases(lake)] == ["r1"]
    released = lake.read("lineage")
    assert released.num_rows == 2  # no second set of released rows
    with pytest.raises(ReleaseError, match="no release 'r11'.*did you mean 'r1'"):
        get_release(lake, "r11")
    with pytest.raises(ReleaseError, match="release name"):
        create_release(lake, "bad name/with slash")


def test_qa_gate_uses_latest_result_per_suite(tmp_path):
    lake = Lake(tmp_path / "lake")
    v0 = add_samples(lake, ["alpha text", "beta text"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_qa_result(lake, table="samples", version=v0, suite="basic", success=False,
                  failed=["expect_column_values_to_not_be_null"], run_id="qa1")
    with pytest.raises(ReleaseError, match="(?s)QA failed.*basic.*expect_column_values_to_not_be_null"):
        create_release(lake, "r-fail")
    assert not lake.exists("releases")

    # a later passing result of the same suite lifts the gate; another suite fails it again
    add_qa_result(lake, table="samples", version=v0, suite="basic", success=True, run_id="qa2")
    add_qa_result(lake, table="samples", version=v0, suite="quality", success=False,
                  failed=["expect_column_mean_to_be_between"], run_id="qa3")
    with pytest.raises(ReleaseError) as info:
        create_release(lake, "r-fail")
    assert "quality" in str(info.value) and "expect_column_mean_to_be_between" in str(info.value)
    assert "suite basic" not in str(info.value)
    add_qa_result(lake, table="samples", version=v0, suite="quality", success=True, run_id="qa4")
    release = create_release(lake, "r-ok")
    assert release.qa_status == "passed" and release.details["qa_suites"] == {"basic": True, "quality": True}

    # results of another version do not count; --require-qa refuses a version without any
    v1 = add_samples(lake, ["gamma text"], "a.jsonl", run_id="job-bbbbbbbbbbbb")
    with pytest.raises(ReleaseError, match="(?s)no QA results.*require-qa"):
        create_release(lake, "r-v1", require_qa=True)
    assert create_release(lake, "r-v1").qa_status == "no_qa_results"
    assert get_release(lake, "r-v1").version == v1
    with pytest.raises(ReleaseError, match="does not exist"):
        create_release(lake, "r-v9", version=9)

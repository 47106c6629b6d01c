"""QA from streamed aggregates gives Great Expectations' own verdicts and observed values, in small batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from datahub.config.suites import Suite
from datahub.lake import external_sort
from datahub.qa import aggregates
from datahub.qa.aggregates import Check
from datahub.qa.validate import run_expectations, run_suites_streaming, validation_frame

EXPECTATIONS = [
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10, "max_value": 1000}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "score"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "score", "mostly": 0.8}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "sample_id"}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "text_id", "mostly": 0.9}},
    {"type": "expect_column_proportion_of_unique_values_to_be_between", "kwargs": {"column": "text_id", "min_value": 0.95}},
    {"type": "expect_column_proportion_of_unique_values_to_be_between", "kwargs": {"column": "lang", "max_value": 0.5}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "text_length", "min_value": 5, "max_value": 60}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "score", "min_value": 0.1, "strict_min": True,
                                                               "mostly": 0.7}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "lang", "value_set": ["en"], "mostly": 0.6}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "quality_words", "value_set": [1, 2, 3]}},
    {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "score", "min_value": 0.2, "max_value": 0.6}},
    {"type": "expect_column_max_to_be_between", "kwargs": {"column": "quality_words", "max_value": 6}},  # sampled
]


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    texts = [f"text {int(i)}" * int(k) for i, k in zip(rng.integers(0, n // 3 + 1, n), rng.integers(1, 9, n))]
    score = [None if rng.random() < 0.1 else float(rng.random()) for _ in range(n)]
    ids = [f"id{int(i)}" for i in rng.integers(0, n * 2, n)]
    return pa.table({
        "sample_id": ids, "text": texts, "lang": rng.choice(["en", "de", "fr"], n, p=[0.7, 0.2, 0.1]).tolist(),
        "score": pa.array(score, pa.float64()),
        "quality": pa.StructArray.from_arrays([pa.array(rng.integers(1, 7, n))], names=["words"]),
    })


@pytest.mark.parametrize("seed, held", [(1, None), (2, None), (3, None), (1, 40)])
def test_streamed_aggregates_give_the_verdicts_great_expectations_gives(tmp_path, monkeypatch, seed, held) -> None:
    if held:  # uniqueness hashes counted and spilled every 40, merged from many runs (and in groups of 3)
        monkeypatch.setattr(aggregates, "HELD_HASHES", held)
        monkeypatch.setattr(external_sort, "FAN_IN", 3)
        monkeypatch.setattr(external_sort, "READ_ROWS", 16)
    table = _table(300, seed)
    suite = Suite("parity.v1", "1", EXPECTATIONS, "test")
    _, expected = run_expectations(validation_frame(table), suite)
    pa.dataset.write_dataset(table, tmp_path / "t", format="parquet", max_rows_per_file=70, max_rows_per_group=70)
    dataset = ds.dataset(tmp_path / "t", format="parquet")
    [(_, got)] = run_suites_streaming(dataset, [suite], total_rows=table.num_rows, batch_rows=32)
    def key(entry):  # GX returns results in its own order
        return entry["expectation"], sorted((k, str(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                                                     else v)) for k, v in entry["kwargs"].items())

    expected = sorted(expected, key=key)
    got = sorted(got, key=key)
    assert [(key(e), e["success"]) for e in got] == [(key(e), e["success"]) for e in expected]
    for mine, theirs in zip(got, expected):
        observed, reference = mine["observed"], theirs["observed"]
        for key in ("observed_value", "element_count", "unexpected_count", "unexpected_percent"):
            if key in reference:
                assert observed[key] == pytest.approx(reference[key]), (mine["expectation"], key)


def test_unknown_types_run_on_a_bounded_sample_and_say_so(tmp_path, monkeypatch) -> None:
    import datahub.qa.validate as validate

    monkeypatch.setattr(validate, "SAMPLE_ROWS", 50)
    table = _table(300, 4)
    pa.dataset.write_dataset(table, tmp_path / "t", format="parquet")
    suite = Suite("s.v1", "1", EXPECTATIONS[-1:], "test")
    [(success, [entry])] = run_suites_streaming(ds.dataset(tmp_path / "t", format="parquet"), [suite],
                                                total_rows=table.num_rows, batch_rows=64)
    assert success and entry["success"] is True and entry["sample"] == "every 6th row: 50 of 300 rows"


def test_spilled_hashes_are_given_back_whole_and_merged_with_counts(monkeypatch) -> None:
    monkeypatch.setattr(aggregates, "HELD_HASHES", 100)
    rng = np.random.default_rng(5)
    parts = [pa.array(rng.integers(0, 400, 70)) for _ in range(6)]
    values = np.concatenate([p.to_numpy() for p in parts])
    _, counts = np.unique(values, return_counts=True)
    expected = (len(counts), len(values), int(counts[counts > 1].sum()))

    def check(batches):
        unique = Check({"type": "expect_column_values_to_be_unique", "kwargs": {"column": "x"}})
        for batch in batches:
            unique.update(len(batch), batch)
        return unique

    whole = check(parts)
    assert whole.spilled is not None and whole.spilled.spilled_runs >= 3
    assert np.array_equal(np.sort(whole.take_hashes()), np.sort(values.view(np.uint64)))  # an engine task's file
    assert whole.spilled is None and not whole.hashes
    first, later = check(parts[:3]), check(parts[3:])
    first.merge(later)  # two parts of the table, each spilled
    assert first._hash_counts() == expected
    assert check(parts).result()[1]["unexpected_count"] == expected[2]


def test_a_value_has_one_hash_whatever_else_its_batch_holds(tmp_path) -> None:
    """The hash function is chosen per value (FNV-1a up to 256 bytes, blake2b past), so a duplicate across two
    batches of different length mixes is found, and the verdict does not depend on the batch size."""
    short, mixed = pa.array(["hello world", "x"]), pa.array(["hello world", "y" * 300])
    assert aggregates.value_hashes(short)[0] == aggregates.value_hashes(mixed)[0]
    assert aggregates.value_hashes(mixed)[1] == aggregates.value_hashes(pa.array(["y" * 300]))[0]
    unique = Check({"type": "expect_column_values_to_be_unique", "kwargs": {"column": "text"}})
    unique.update(2, short)
    unique.update(2, mixed)
    assert unique.result()[0] is False and unique.result()[1]["unexpected_count"] == 2
    texts = ["dup text", "a0", "a1", "a2", "dup text", "long " * 80, "b0", "b1"]
    pa.dataset.write_dataset(pa.table({"sample_id": [str(i) for i in range(8)], "text": texts}), tmp_path / "t",
                             format="parquet")
    suite = Suite("t", "1", [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "text_id"}}], "t")
    for batch_rows in (100, 4, 3):
        [(success, [entry])] = run_suites_streaming(ds.dataset(tmp_path / "t", format="parquet"), [suite],
                                                    total_rows=8, batch_rows=batch_rows)
        assert success is False and entry["observed"]["unexpected_count"] == 2, batch_rows


def test_nan_is_missing_as_in_great_expectations(tmp_path, capsys) -> None:
    """A NaN quality score is a missing value (GX on pandas): the mean of the rest, not_null counts it, between
    skips it; observed values are strict JSON (``qa --json``)."""
    import json

    from datahub.cli.output import print_json

    scores = [0.1, float("nan"), 0.2, None]
    table = pa.table({"sample_id": list("abcd"), "text": list("wxyz"),
                      "quality": pa.array([{"score": s} for s in scores], pa.struct([("score", pa.float64())]))})
    pa.dataset.write_dataset(table, tmp_path / "t", format="parquet")
    suite = Suite("t", "1", [
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "quality_score", "min_value": 0.6}},
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "quality_score", "max_value": 0.2}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "quality_score", "mostly": 0.6}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "quality_score", "max_value": 0.15}},
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "quality_score"}},
    ], "t")
    [(_, got)] = run_suites_streaming(ds.dataset(tmp_path / "t", format="parquet"), [suite], total_rows=4,
                                      batch_rows=2)
    _, expected = run_expectations(validation_frame(table), suite)
    assert [e["success"] for e in got] == [False, True, False, False, True]
    assert sorted(map(json.dumps, ((e["expectation"], e["kwargs"], e["success"]) for e in got))) == \
        sorted(map(json.dumps, ((e["expectation"], e["kwargs"], e["success"]) for e in expected)))
    assert got[0]["observed"]["observed_value"] == pytest.approx(0.15)
    assert got[2]["observed"]["unexpected_count"] == 2
    # a NaN observed value (a mean of NaN, the mean of infinities) prints as null: strict JSON
    print_json({"observed": float("nan"), "values": [float("inf"), 1.5]})
    assert json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c)) == \
        {"observed": None, "values": [None, 1.5]}
    assert not Check({"type": "expect_column_mean_to_be_between", "kwargs": {"min_value": 0}}).result()[0]
    assert aggregates._within(float("nan"), {"min_value": 0.0}) is False


def test_an_expectation_that_does_not_fit_the_column_type_fails_alone_naming_it(tmp_path) -> None:
    """GX marks such an expectation failed with its error and judges the rest; the streamed pass does the same
    (it raised a bare Arrow error naming neither the expectation nor the column)."""
    table = pa.table({"sample_id": ["a", "b"], "text": ["x", "y"], "source_offset": pa.array([1, 2], pa.int64())})
    pa.dataset.write_dataset(table, tmp_path / "t", format="parquet")
    suite = Suite("bad.v1", "1", [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "sample_id", "min_value": 1}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "source_offset", "value_set": ["1", "2"]}},
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1}},
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "sample_id"}},
    ], "t")
    [(success, entries)] = run_suites_streaming(ds.dataset(tmp_path / "t", format="parquet"), [suite],
                                                total_rows=2, batch_rows=1)
    assert success is False
    assert [e["success"] for e in entries] == [False, False, True, True]
    assert "bad.v1: expect_column_values_to_be_between on column 'sample_id' (string)" in entries[0]["error"]
    assert "expect_column_values_to_be_in_set on column 'source_offset' (int64)" in entries[1]["error"]
    assert "fix the suite's kwargs" in entries[1]["error"]
    assert not entries[2].get("error") and not entries[3].get("error")


def test_unexpected_rows_without_a_sample_id_are_counted_not_named_none(tmp_path):
    """A failed row check names the sample ids of its rows; a row whose sample_id is null has none to name (not the
    string 'None'): it is counted in unexpected_rows_without_sample_id. A check on sample_id itself names no ids."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sample_id": ["a" * 32, None, None, "b" * 32],
                             "text": ["a text of some words", "", "another text here", ""]}), tmp_path / "p.parquet")
    suite = Suite("ids.v1", "1", [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "sample_id"}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "text_length", "min_value": 1}}], "ids")
    [(ok, (on_id, on_text))] = run_suites_streaming(ds.dataset(tmp_path, format="parquet"), [suite], total_rows=4)
    assert not ok and on_id["observed"]["unexpected_count"] == 2 and on_text["observed"]["unexpected_count"] == 2
    assert "unexpected_sample_ids" not in on_id and "unexpected_rows_without_sample_id" not in on_id
    assert on_text["unexpected_sample_ids"] == ["b" * 32]
    assert on_text["unexpected_rows_without_sample_id"] == 1

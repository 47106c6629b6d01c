"""QA run by the engines gives the local pass's verdicts: Ray tasks (partial aggregates per data file, merged on
the driver) and Great Expectations' Spark engine on a Spark DataFrame, on a small lake of several files with
failing expectations."""

from __future__ import annotations

import json

import pytest

from datahub.lake import Lake
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.qa.test_aggregates import EXPECTATIONS, _table


def _key(entry: dict) -> tuple:
    kwargs = sorted((k, str(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v))
                    for k, v in entry["kwargs"].items())
    return entry["expectation"], tuple(kwargs)


def _verdicts(results) -> list:
    return [(r.suite, r.success, sorted((_key(e), e["success"]) for e in r.results)) for r in results]


@pytest.fixture
def lake(tmp_path):
    """Three commits (three data files) of the parity table; sample ids repeat across files."""
    lake = Lake(tmp_path / "lake")
    table = _table(240, 7)
    for part in range(3):
        lake.commit("samples", table.slice(part * 80, 80), txn=f"part{part}")
    suite = {"name": "parity.v1", "meta": {"version": "1"}, "expectations": EXPECTATIONS}
    (tmp_path / "parity.v1.json").write_text(json.dumps(suite))
    lake.suite = str(tmp_path / "parity.v1.json")
    return lake


def test_ray_and_spark_give_the_local_verdicts(lake, ray_engine, spark_engine, monkeypatch):  # noqa: F811
    import datahub.qa.validate as validate
    from datahub.qa import run_suites

    monkeypatch.setattr(validate, "SAMPLE_ROWS", 50)  # the sampled type reads every 5th row, across files
    assert len(lake.dataset("samples", int(lake.table("samples").version())).files) == 3
    suites = ["samples.v1", lake.suite]
    local = run_suites(lake, suites=suites, commit=False)
    on_ray = run_suites(lake, suites=suites, commit=False, engine=ray_engine)
    on_spark = run_suites(lake, suites=suites, commit=False, engine=spark_engine)
    assert _verdicts(on_ray) == _verdicts(local)
    assert _verdicts(on_spark) == _verdicts(local)
    failing = {_key(e)[0] for r in local for e in r.failed_expectations}
    assert not local[0].success and "expect_column_values_to_be_unique" in failing  # ids repeat across files
    assert any(e["success"] for r in local for e in r.results)
    # Ray merges the very aggregates the local pass computes: observed values match, examples in scan order
    for mine, theirs in zip(on_ray, local):
        assert sorted(map(json.dumps, mine.results)) == sorted(map(json.dumps, theirs.results))


def test_cli_refuses_an_unknown_engine(lake):
    from typer.testing import CliRunner

    from datahub.cli.main import app

    out = CliRunner().invoke(app, ["qa", "--lake", lake.root, "--engine", "dask"])
    assert out.exit_code == 2 and "local, ray or spark" in out.output


def test_spark_falls_back_to_the_local_pass_where_gx_raises(lake):
    """An expectation GX could not run on Spark (an error entry) is computed by the local streaming pass and says
    so; the others keep the Spark entries."""
    from datahub.config.suites import load_suite
    from datahub.qa.engine import _fallback
    from datahub.qa.validate import run_suites_streaming

    suite = load_suite(lake.suite)
    version = int(lake.table("samples").version())
    dataset = lake.dataset("samples", version)
    success, local = run_suites_streaming(dataset, [suite], total_rows=dataset.count_rows())[0]
    broken = [dict(e) for e in local]
    raised = next(i for i, e in enumerate(broken) if e["success"] is False)
    broken[raised] = {**broken[raised], "success": False, "observed": None, "error": "no Spark implementation"}
    kept = next(i for i, e in enumerate(broken) if e["success"])
    broken[kept] = {**broken[kept], "observed": {"from": "spark"}}
    ok, merged = _fallback(lake, suite, (False, broken), table="samples", version=version)
    assert ok == success
    assert "no Spark implementation" in merged[raised]["spark_fallback"] and "error" not in merged[raised]
    assert {k: v for k, v in merged[raised].items() if k != "spark_fallback"} == local[raised]
    assert merged[kept]["observed"] == {"from": "spark"}  # entries GX ran on Spark are kept as they are


def test_duplicates_across_files_and_nan_scores_give_gx_verdicts_on_every_engine(tmp_path, ray_engine,
                                                                                  spark_engine):  # noqa: F811
    """Two files: 'dup text' in both, the second with a long text (blake2b) and a NaN score. The duplicate is found
    and NaN is missing (mean of the rest fails the gate) on local, Ray and Spark, as GX on the whole frame."""
    import pyarrow as pa

    from datahub.config.suites import Suite
    from datahub.qa import run_suites
    from datahub.qa.validate import run_expectations, validation_frame

    quality = pa.struct([("score", pa.float64())])

    def part(ids, texts, scores):
        return pa.table({"sample_id": ids, "text": texts, "quality": pa.array([{"score": s} for s in scores], quality)})

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", part(["a", "b"], ["dup text", "short"], [0.1, 0.2]), txn="s/1")
    lake.commit("samples", part(["c", "d"], ["dup text", "long " * 100], [float("nan"), 0.3]), txn="s/2")
    expectations = [
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "text_id"}},
        {"type": "expect_column_mean_to_be_between", "kwargs": {"column": "quality_score", "min_value": 0.6}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "quality_score"}},
    ]
    (tmp_path / "t.json").write_text(json.dumps({"name": "t", "meta": {"version": "1"}, "expectations": expectations}))
    _, whole = run_expectations(validation_frame(lake.read("samples")), Suite("t", "1", expectations, "t"))
    assert sorted((_key(e), e["success"]) for e in whole) == sorted((_key(e), False) for e in whole)
    for engine in ("local", ray_engine, spark_engine):
        [result] = run_suites(lake, suites=[str(tmp_path / "t.json")], commit=False, engine=engine)
        assert sorted((_key(e), e["success"]) for e in result.results) == \
            sorted((_key(e), e["success"]) for e in whole), engine
        mean = next(e for e in result.results if e["expectation"] == "expect_column_mean_to_be_between")
        assert mean["observed"]["observed_value"] == pytest.approx(0.2), engine


def test_a_failed_row_check_names_the_same_first_sample_ids_on_every_engine(tmp_path, ray_engine,
                                                                            spark_engine):  # noqa: F811
    """Three files (three commits) with known failing rows, more than 20 of them, spread over the files, ids not in
    sorted order and one failing row without an id: local, Ray and Spark name the same first 20 ids in scan order
    (file by file, row by row) and count the row without an id."""
    import pyarrow as pa

    from datahub.qa import run_suites

    lake = Lake(tmp_path / "lake")
    for part in range(3):
        ids = [f"z{part}-{row:03d}" if row % 4 else f"a{part}-{row:03d}" for row in range(40)]
        score = [None if row % 3 == 0 else 0.5 for row in range(40)]
        lang = ["xx" if row % 5 == 0 else "en" for row in range(40)]
        if part == 1:
            ids[3], score[3] = None, None  # a failing row with no id to name
        lake.commit("samples", pa.table({"sample_id": pa.array(ids, pa.string()), "text": ["t"] * 40, "lang": lang,
                                         "score": pa.array(score, pa.float64())}), txn=f"part{part}")
    # scan order: the version's files as the Delta snapshot lists them (what the local pass reads), rows in order
    rows = pa.concat_tables(f.to_table() for f in lake.dataset("samples").get_fragments()).to_pylist()
    failing = [r["sample_id"] for r in rows if r["score"] is None and r["sample_id"] is not None]
    low = [r["sample_id"] for r in rows if r["score"] is not None]
    other_lang = [r["sample_id"] for r in rows if r["lang"] != "en"]
    assert failing[:20] != sorted(failing)[:20] and len(failing) > 20
    expectations = [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "score"}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "score", "min_value": 0.6}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "lang", "value_set": ["en"]}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "sample_id"}},
    ]
    (tmp_path / "t.json").write_text(json.dumps({"name": "t", "meta": {"version": "1"}, "expectations": expectations}))
    named = {}
    for engine in ("local", ray_engine, spark_engine):
        [result] = run_suites(lake, suites=[str(tmp_path / "t.json")], commit=False, engine=engine)
        named[getattr(engine, "name", engine)] = {
            _key(e): (e.get("unexpected_sample_ids"), e.get("unexpected_rows_without_sample_id"))
            for e in result.results}
    def key(index: int) -> tuple:
        return _key({"expectation": expectations[index]["type"], "kwargs": expectations[index]["kwargs"]})

    not_null = key(0)
    assert named["local"][not_null] == (failing[:20], 1)
    assert named["local"][key(1)] == (low[:20], None)
    assert named["local"][key(2)] == (other_lang[:20], None)
    assert named["local"][key(3)] == (None, None)  # a check on the ids names none
    assert named["ray"] == named["local"]
    assert named["spark"] == named["local"]


def _positioned(spark_engine, rows: int = 10_000):  # noqa: F811
    """A Spark frame shaped as QA's: ids, a score, a lang, and each row's (FILE, ROW): four files of 2,500 rows,
    listed in reverse order of the ids; every 1,000th row has no id."""
    from pyspark.sql import functions as F

    from datahub.qa.engine import FILE, ROW

    return spark_engine.session.range(rows, numPartitions=4).select(
        F.when(F.col("id") % 1_000 != 1, F.concat(F.lit("id"), F.col("id").cast("string"))).alias("sample_id"),
        (F.col("id") % 7).alias("score"), F.lit("en").alias("lang"),
        (3 - F.floor(F.col("id") / 2_500)).cast("long").alias(FILE), (F.col("id") % 2_500).alias(ROW))


def _entry(kind: str, column: str, **kwargs) -> dict:
    return {"expectation": kind, "kwargs": {"column": column, **kwargs}, "success": False,
            "observed": {"unexpected_count": 1}}


def test_spark_takes_the_first_unexpected_ids_with_a_limit_on_the_engine(spark_engine):  # noqa: F811
    """The ids come from one aggregate that keeps each check's first 20 (file, row) in every task (min_by with a
    limit: partial_min_by on the tasks), not a collect of every unexpected row; the row without an id is counted."""
    from datahub.qa.engine import _first_unexpected

    frame = _positioned(spark_engine)
    query = frame.selectExpr(*_first_unexpected("score = 1", "sample_id", 0))
    assert "partial_min_by" in query._jdf.queryExecution().executedPlan().toString()
    order = sorted((3 - i // 2_500, i % 2_500, i) for i in range(10_000) if i % 7 == 1)
    row = query.collect()[0]
    assert row["ids0"] == [f"id{i}" for _, _, i in order if i % 1_000 != 1][:20]
    assert row["without0"] == sum(1 for i in range(10_000) if i % 7 == 1 and i % 1_000 == 1)


def _jobs(spark_engine, run) -> int:  # noqa: F811
    context = spark_engine.session.sparkContext
    group = f"qa-test-{id(run)}"
    context.setJobGroup(group, group)
    try:
        run()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup(group))


def test_naming_the_ids_of_several_checks_runs_the_jobs_of_one(spark_engine):  # noqa: F811
    """One Spark aggregate names every check's ids: three checks cost the jobs of one (it was a sort-with-limit job
    per check, each reading the table again, and a count job)."""
    from datahub.qa.engine import _name_unexpected_rows

    frame = _positioned(spark_engine).persist()
    try:
        frame.count()
        one = [_entry("expect_column_values_to_be_between", "score", max_value=5)]
        three = [_entry("expect_column_values_to_be_between", "score", max_value=5),
                 _entry("expect_column_values_to_be_in_set", "score", value_set=[1, 2, 3]),
                 _entry("expect_column_values_to_not_be_null", "lang")]
        assert _jobs(spark_engine, lambda: _name_unexpected_rows(frame, one)) == \
            _jobs(spark_engine, lambda: _name_unexpected_rows(frame, three))
        assert len(three[0]["unexpected_sample_ids"]) == 20 and three[0]["unexpected_sample_ids"] == \
            one[0]["unexpected_sample_ids"]
        assert "unexpected_sample_ids" not in three[2]  # no null lang: nothing to name
    finally:
        frame.unpersist(blocking=True)


def test_a_check_spark_cannot_name_keeps_its_verdict_and_the_others_ids(spark_engine):  # noqa: F811
    """A predicate Spark cannot type (a value_set of mixed types) or whose job fails (ANSI: 'en' cast to a number)
    records why on its entry; the other checks are still named and nothing raises."""
    from datahub.qa.engine import _name_unexpected_rows

    frame = _positioned(spark_engine, 2_000)
    good = _entry("expect_column_values_to_be_between", "score", max_value=5)
    untyped = _entry("expect_column_values_to_be_in_set", "score", value_set=[5, 0.5, True])
    failing = _entry("expect_column_values_to_be_between", "lang", min_value=5)
    _name_unexpected_rows(frame, [untyped, good, failing])
    assert len(good["unexpected_sample_ids"]) == 20 and "unexpected_sample_ids_error" not in good
    for entry in (untyped, failing):
        assert "unexpected_sample_ids" not in entry and entry["success"] is False
        assert entry["unexpected_sample_ids_error"].startswith("Spark could not name"), entry


def test_spark_qa_leaves_no_cached_dataframe(lake, spark_engine):  # noqa: F811
    """A Spark QA run unpersists what it cached (GX persisted its DataFrame and never released it: one cached copy
    more per suite run in a long-lived session)."""
    from datahub.qa import run_suites

    context = spark_engine.session.sparkContext
    before = context._jsc.getPersistentRDDs().size()
    for _ in range(2):
        run_suites(lake, suites=["samples.v1", lake.suite], commit=False, engine=spark_engine)
    assert context._jsc.getPersistentRDDs().size() == before


def test_a_null_in_the_value_set_hides_no_ids_on_spark(tmp_path, spark_engine):  # noqa: F811
    """value_set ["en", None]: the local pass (as GX on pandas) tests non-null values, which None matches none of,
    fails and names the other languages' ids. Spark gives the same verdict, observed counts and ids (GX on Spark
    tested ``lang IN ('en', NULL)``, null for 'de': 0 unexpected, passed; and ``NOT lang IN (..., NULL)`` named
    none), with the suite's value_set in the entry."""
    import pyarrow as pa

    from datahub.qa import run_suites

    lake = Lake(tmp_path / "lake")
    lang = ["en", "de", None, "fr", "en", "xx", "en", None, "de", "en"]
    lake.commit("samples", pa.table({"sample_id": [f"s{i}" for i in range(10)], "text": ["t"] * 10, "lang": lang}),
                txn="t0")
    suite = {"name": "t", "meta": {"version": "1"}, "expectations": [
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "lang", "value_set": ["en", None]}}]}
    (tmp_path / "t.json").write_text(json.dumps(suite))
    local, spark = (run_suites(lake, suites=[str(tmp_path / "t.json")], commit=False, engine=engine)[0].results[0]
                    for engine in ("local", spark_engine))
    assert local["success"] is False and local["unexpected_sample_ids"] == ["s1", "s3", "s5", "s8"]
    assert (spark["success"], spark["observed"]["unexpected_count"]) == (False, 4)
    assert spark["unexpected_sample_ids"] == local["unexpected_sample_ids"]
    assert spark["kwargs"]["value_set"] == ["en", None]


def test_a_spark_task_numbers_rows_of_any_file_index(lake):
    """Positions are (file index, row) columns: file index 2**23 gave OverflowError when packed as index << 40."""
    from datahub.qa.engine import FILE, ROW, _FileValidationColumns

    version = int(lake.table("samples").version())
    path = next(iter(lake.dataset("samples", version).get_fragments())).path
    task = _FileValidationColumns(lake, "samples", version, ("sample_id",), frozenset({"sample_id"}), 64)
    tables = list(task((1 << 23, path)))
    assert {v for t in tables for v in t.column(FILE).to_pylist()} == {1 << 23}
    assert [v for t in tables for v in t.column(ROW).to_pylist()] == list(range(80))

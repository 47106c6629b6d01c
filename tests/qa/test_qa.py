"""QA suites on real Delta tables: results recorded in qa_results, read back, CLI exit codes,
the job-spec gate through run_job on the shared Ray, and lazy GX imports."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from datahub.lake import Lake
from tests.conftest import REPO

PROSE = ("The module reads the files that are given to it and returns their text. It is the first "
         "step of the pipeline, and the other steps depend on it to get the data right. ")


def samples(ids: list[str], texts: list[str]) -> pa.Table:
    quality = pa.StructArray.from_arrays([pa.array(["en"] * len(ids)), pa.array([0.99] * len(ids))],
                                         names=["language", "language_score"])
    return pa.table({"sample_id": ids, "text": texts, "source_uri": ["file:///x.jsonl"] * len(ids), "quality": quality})


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    lake.good = lake.commit("samples", samples(["a", "b", "c"], [PROSE + "1", PROSE + "2", PROSE + "3"]), txn="good")
    lake.bad = lake.commit("samples", samples(["a", "a", "c"], [PROSE, PROSE, PROSE]), txn="bad", mode="overwrite")
    return lake


def test_suite_passes_on_good_version_and_fails_on_bad_one(lake):
    from datahub.qa import releasable, results_for, run_suite

    good = run_suite(lake, suite="samples.v1", version=lake.good, run_id="r1")
    bad = run_suite(lake, suite="samples.v1", version=lake.bad, run_id="r1")
    assert good.success and not good.failed_expectations
    assert not bad.success
    failed = {(e["expectation"], e["kwargs"].get("column")) for e in bad.failed_expectations}
    assert ("expect_column_values_to_be_unique", "sample_id") in failed
    assert ("expect_column_proportion_of_unique_values_to_be_between", "text_id") in failed
    skipped = [e for e in good.results if e["success"] is None]
    assert skipped and all("not in table" in e["skipped"] for e in skipped)  # gopher/fineweb columns absent

    back = results_for(lake, table="samples", version=lake.bad)
    assert [(r.suite, r.success, r.suite_version) for r in back] == [("samples.v1", False, "1")]
    assert back[0].failed_expectations == bad.failed_expectations
    assert releasable(lake, table="samples", version=lake.good) and not releasable(lake, table="samples", version=lake.bad)
    assert not releasable(lake, table="samples", version=lake.good, required=["other.v1"])  # a required suite never ran
    from datahub.release import qa_verdict  # the release gate is the one source of truth

    assert qa_verdict(lake, table="samples", version=lake.bad).failed["samples.v1"] == bad.failed_expectations
    assert results_for(lake, table="samples", version=7) == []
    rows = lake.read("qa_results")
    assert rows.num_rows == 2 and set(rows.column("table_version").to_pylist()) == {lake.good, lake.bad}
    # the same run recorded again is a no-op (idempotent txn)
    from datahub.qa import record

    assert record(lake, bad) is None and lake.read("qa_results").num_rows == 2


def test_unknown_suite_names_known_ones(lake):
    from datahub.config.suites import available_suites
    from datahub.errors import SpecError
    from datahub.qa import run_suite

    with pytest.raises(SpecError, match="samples.v1") as raised:
        run_suite(lake, suite="samples.v9")
    assert "did you mean 'samples.v1'" in str(raised.value) and "by its path" in str(raised.value)  # and the fix
    assert "?;" not in str(raised.value) and "'samples.v1'? Name one" in str(raised.value)
    with pytest.raises(SpecError, match="check the path") as raised:
        run_suite(lake, suite="suites/mine.v1.json")
    assert f"schemas/gx ({', '.join(available_suites())})" in str(raised.value)
    with pytest.raises(SpecError, match="add .json") as raised:  # a path without .json is not a bundled name
        run_suite(lake, suite="suites/mine.v1")
    assert "--suite suites/mine.v1.json" in str(raised.value)


def test_cli_qa_exit_codes_and_json(lake):
    from datahub.cli.main import app

    runner = CliRunner()
    ok = runner.invoke(app, ["qa", lake.root, "--version", str(lake.good), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout[ok.stdout.index("{"):])["success"] is True
    bad = runner.invoke(app, ["qa", lake.root, "--suite", "samples.v1"])
    assert bad.exit_code == 1
    assert "FAILED" in bad.output and "expect_column_values_to_be_unique" in bad.output


def test_job_spec_qa_gate_runs_after_the_samples_commit(job_spec, ray_engine, tmp_path):
    from datahub.pipeline.run import run_job
    from datahub.qa import results_for, run_for_job

    data = tmp_path / "docs.jsonl"
    docs = [PROSE * 2 + f"number {i}." for i in range(5)] + [PROSE * 2 + "number 0."] + ["buy cheap now " * 30]
    data.write_text("\n".join(json.dumps({"text": t}) for t in docs) + "\n")
    spec = job_spec(inputs=[{"uri": str(data)}],
                    graph={"gopher": {"op": "gopher_quality"}, "samples": {"sink": "samples", "after": ["gopher"]}},
                    qa={"suites": ["samples.v1"]})
    result = run_job(spec, engine=ray_engine, qa_gate=run_for_job)
    qa = result.counts["qa"]
    version = result.table_versions["samples"]
    assert qa["table_version"] == version and qa["success"] is False  # the exact duplicate fails the gate
    recorded = results_for(Lake(spec.lake.root), table="samples", version=version)
    assert [r.run_id for r in recorded] == [result.run_id] and not recorded[0].success
    assert result.counts["dropped"] == {"gopher_not_enough_stop_words": 1}


def test_spec_rejects_unknown_suite(job_spec):
    from datahub.errors import SpecError

    with pytest.raises(SpecError, match=r"qa\.suites.*samples\.v1"):
        job_spec(qa={"suites": ["nope.v1"]})


def test_cli_help_and_import_do_not_load_great_expectations():
    # `datahub --help` through the typer app (main() itself leaves with os._exit, so nothing could print after it)
    code = ("import sys\nfrom datahub.cli.main import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "import datahub, datahub.qa, datahub.report, operators\n"
            "print('GX' if any(m.split('.')[0] == 'great_expectations' for m in sys.modules) else 'clean')\n"
            "print('MPL' if 'matplotlib' in sys.modules else 'clean')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-2:] == ["clean", "clean"], out.stdout

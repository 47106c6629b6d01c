"""QA gate end to end: the real samples.v1 GX suite via `datahub qa`, then `datahub release create`."""

from __future__ import annotations

import json

import pyarrow as pa
from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import get_release, qa_verdict
from tests.release.helpers import sample_rows

PROSE = ("The reader opens each input file, decodes its records and hands their text to the next step "
         "of the pipeline, which keeps what passes the checks. ")


def _with_language(rows: pa.Table) -> pa.Table:
    """A quality struct with only the language signals: the suite's gopher/fineweb checks are skipped."""
    n = rows.num_rows
    quality = pa.StructArray.from_arrays([pa.array(["en"] * n), pa.array([0.98] * n)],
                                         names=["language", "language_score"])
    return rows.append_column("quality", quality)


def test_failed_suite_refuses_release_naming_only_real_failures(tmp_path):
    lake = Lake(tmp_path / "lake")
    texts = [PROSE + "first."] * 3 + [PROSE + f"number {i}." for i in range(3)]  # 3 copies: ids not unique
    bad = lake.commit("samples", _with_language(sample_rows(texts, "a.jsonl")), txn="bad-run")
    runner = CliRunner()

    qa = runner.invoke(app, ["qa", lake.root, "--json"])
    assert qa.exit_code == 1, qa.output
    results = json.loads(qa.stdout[qa.stdout.index("{"):])["results"][0]["results"]
    failed = {(e["expectation"], e["kwargs"].get("column")) for e in results if e["success"] is False}
    assert failed == {("expect_column_values_to_be_unique", "sample_id"),
                      ("expect_column_proportion_of_unique_values_to_be_between", "text_id")}
    skipped = {e["kwargs"]["column"] for e in results if e["success"] is None}
    assert "quality_gopher_alpha_words_ratio" in skipped and "quality_language" not in skipped

    refused = runner.invoke(app, ["release", "create", "corpus-1", "--lake", lake.root])
    assert refused.exit_code != 0 and isinstance(refused.exception, ReleaseError)
    message = str(refused.exception)
    assert f"QA failed for samples v{bad}" in message
    assert "expect_column_values_to_be_unique column='sample_id'" in message
    assert "expect_column_proportion_of_unique_values_to_be_between column='text_id'" in message
    listed = [line for line in message.splitlines() if line.startswith("  suite samples.v1:")]
    assert len(listed) == 2  # skipped optional expectations are not failures
    assert f"datahub qa --lake {lake.root} --table samples" in message  # a command that exists
    assert not lake.exists("releases")

    # the data is fixed by a new run; QA passes on that version and the release goes through
    fixed = lake.commit("samples", _with_language(sample_rows([PROSE + f"number {i}." for i in range(6)], "a.jsonl")),
                        txn="fixed-run", mode="overwrite")
    assert runner.invoke(app, ["qa", lake.root]).exit_code == 0
    created = runner.invoke(app, ["release", "create", "corpus-1", "--lake", lake.root, "--require-qa", "--json"])
    assert created.exit_code == 0, created.output
    data = json.loads(created.output)
    assert (data["version"], data["qa_status"], data["row_count"]) == (fixed, "passed", 6)
    assert data["details"]["qa_suites"] == {"samples.v1": True}
    # the bad version stays refused
    again = runner.invoke(app, ["release", "create", "corpus-old", "--lake", lake.root, "--version", str(bad)])
    assert isinstance(again.exception, ReleaseError) and "QA failed" in str(again.exception)
    assert get_release(lake, "corpus-1").version == fixed
    assert qa_verdict(lake, table="samples", version=bad).status == "failed"


def test_require_qa_hint_names_the_real_qa_command(tmp_path):
    lake = Lake(tmp_path / "lake")
    version = lake.commit("samples", sample_rows(["one doc", "two docs"], "a.jsonl"), txn="run")
    out = CliRunner().invoke(app, ["release", "create", "r", "--lake", lake.root, "--require-qa"])
    assert isinstance(out.exception, ReleaseError)
    hint = str(out.exception).rsplit(": ", 1)[-1]
    assert hint == f"datahub qa --lake {lake.root} --table samples --version {version}"
    # the hinted command runs as printed and records a result the gate then reads
    ran = CliRunner().invoke(app, hint.split()[1:])
    assert ran.exit_code == 0, ran.output
    assert qa_verdict(lake, table="samples", version=version).passed

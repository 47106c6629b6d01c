"""samples.v1 bounds documents, not post-training samples: its 1,000,000-character bound is on ``document_length``
(``text_length`` of rows of a document kind: ``text``, ``image_text``, a null kind, or a table without ``kind``;
null on chat, preference and trajectory rows), while ``text_length >= 1`` still judges every row. A realistic agent
rollout (600 steps of 8 KB terminal output: ~4.9M characters rendered) and a 1.2M-character chat used to fail the
gate (and so `datahub release create`); a 1.2M-character text document still fails it, on the local pass, Ray and
Spark alike, naming that document's sample_id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.qa.test_posttraining import CHATS, EPISODES, PAIRS, TEXTS

MAX_DOCUMENT = 1_000_000  # samples.v1's bound on a document's characters


def _terminal(step: int, chars: int) -> str:
    """``chars`` characters of a build log, distinct per step (a real agent's terminal observation)."""
    line = f"[step {step:04d}] gcc -O2 -c src/module_{step}.c -o build/module_{step}.o: warning: unused variable\n"
    return (line * (chars // len(line) + 1))[:chars]


LONG_EPISODE = {"episode_id": "rollout-600", "steps": [
    {"observation": _terminal(i, 8000), "action": f"make -j2 module_{i}", "reward": 0.0} for i in range(600)]}
LONG_CHAT = {"messages": [{"role": "user", "content": "Paste the whole build log and summarize it."},
                          {"role": "assistant", "content": "Summary of the chat log. " + _terminal(0, 1_200_000)}]}
LONG_TEXT = "A long document. " + "word " * 240_000  # 1.2M characters, kind text


def _build(root: Path, name: str, *, chats=(), pairs=(), episodes=(), texts=()) -> Lake:
    """A lake written by run_job (ingest allows 20 MB records, as jobs/trajectory-demo.yaml does)."""
    inputs = root / f"{name}-in"
    inputs.mkdir()
    specs = []
    for kind, records in (("chat", chats), ("preference", pairs), ("trajectory", episodes)):
        if records:
            (inputs / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            specs.append({"uri": str(inputs / f"{kind}.jsonl"), "kind": kind})
    if texts:
        (inputs / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        specs.append({"uri": str(inputs / "text.jsonl")})
    raw: dict[str, Any] = {"name": name, "lake": {"root": str(root / name)}, "inputs": specs,
                           "limits": {"max_record_bytes": 20_000_000},
                           "graph": {"samples": {"sink": "samples"}}}
    result = run_job(validate_job_spec(raw, source=f"{name}.yaml"), engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    assert result.counts["quarantined_total"] == 0, result.counts
    return Lake(root / name)


@pytest.fixture(scope="module")
def lakes(tmp_path_factory) -> dict[str, Lake]:
    root = tmp_path_factory.mktemp("document-length")
    posttraining = dict(chats=[*CHATS, LONG_CHAT], pairs=PAIRS, episodes=[*EPISODES, LONG_EPISODE], texts=TEXTS)
    return {"long-rollouts": _build(root, "long-rollouts", **posttraining),
            "long-document": _build(root, "long-document", **{**posttraining, "texts": [*TEXTS, LONG_TEXT]})}


def _lengths(lake: Lake) -> dict[str, int]:
    rows = lake.read("samples", columns=["kind", "text"]).to_pylist()
    return {r["kind"] + ":" + r["text"][:40]: len(r["text"]) for r in rows}


def _sample_id(lake: Lake, prefix: str) -> str:
    [found] = [r["sample_id"] for r in lake.read("samples", columns=["sample_id", "text"]).to_pylist()
               if r["text"].startswith(prefix)]
    return found


def _entry(result, column: str) -> dict:
    [entry] = [e for e in result.results if e["kwargs"].get("column") == column
               and e["expectation"] == "expect_column_values_to_be_between"]
    return entry


@pytest.mark.parametrize("engine", ["local", "ray", "spark"])
def test_long_post_training_rows_pass_samples_v1_and_a_long_document_still_fails(lakes, engine, request):
    from datahub.qa import run_suites

    chosen = {"local": "local", "ray": "ray_engine", "spark": "spark_engine"}[engine]
    engine_arg = chosen if chosen == "local" else request.getfixturevalue(chosen)
    long_lake, document_lake = lakes["long-rollouts"], lakes["long-document"]
    over = {key for key, length in _lengths(long_lake).items() if length > MAX_DOCUMENT}
    assert {key.split(":")[0] for key in over} == {"chat", "trajectory"}  # the premise: both are over 1M chars
    assert max(_lengths(long_lake).values()) > 4_000_000  # the rollout renders to ~4.9M characters

    [passed] = run_suites(long_lake, suites=["samples.v1"], commit=False, engine=engine_arg)
    assert passed.success, [e for e in passed.results if e["success"] is False]
    document = _entry(passed, "document_length")
    assert document["success"] is True and document["kwargs"] == {"column": "document_length",
                                                                  "max_value": MAX_DOCUMENT}
    assert _entry(passed, "text_length")["kwargs"] == {"column": "text_length", "min_value": 1}

    [failed] = run_suites(document_lake, suites=["samples.v1"], commit=False, engine=engine_arg)
    assert not failed.success
    assert [(e["expectation"], e["kwargs"]["column"]) for e in failed.failed_expectations] == [
        ("expect_column_values_to_be_between", "document_length")]
    entry = _entry(failed, "document_length")
    assert entry["observed"]["unexpected_count"] == 1  # the text document, not the chat or the rollout
    assert entry["unexpected_sample_ids"] == [_sample_id(document_lake, "A long document.")]


def test_the_streamed_pass_and_gx_on_the_whole_frame_agree(lakes):
    """``validation_frame`` (GX on one pandas frame) derives ``document_length`` as the streamed pass does."""
    from datahub.config.suites import load_suite
    from datahub.qa import run_suites
    from datahub.qa.validate import run_expectations, validation_frame

    suite = load_suite("samples.v1")
    for lake in lakes.values():
        [streamed] = run_suites(lake, suites=["samples.v1"], commit=False)
        frame = validation_frame(lake.read("samples"))
        _, whole = run_expectations(frame, suite)
        assert sorted((e["expectation"], e["kwargs"].get("column"), e["success"]) for e in whole) == \
            sorted((e["expectation"], e["kwargs"].get("column"), e["success"]) for e in streamed.results)
        kinds = frame["kind"].tolist()
        lengths = frame["document_length"].tolist()
        assert all((length != length) == (kind in ("chat", "preference", "trajectory"))  # NaN: not judged
                   for kind, length in zip(kinds, lengths))


@pytest.mark.parametrize("kind", [None, "text", "image_text", "no-kind-column"])
def test_every_document_row_keeps_the_bound(tmp_path, kind):
    """A text row, an image caption, a row with a null kind and a table without ``kind`` keep today's verdict at the
    bound: 1,000,000 characters pass, 1,000,001 fail."""
    from datahub.qa import run_suites

    lake = Lake(tmp_path / "lake")
    texts = ["x" * MAX_DOCUMENT, "y" * (MAX_DOCUMENT + 1), "short document"]
    table = pa.table({"sample_id": ["at", "over", "short"], "text": texts})
    if kind != "no-kind-column":
        table = table.append_column("kind", pa.array([kind] * 3, pa.string()))
    lake.commit("samples", table, txn="s/1")
    [result] = run_suites(lake, suites=["samples.v1"], commit=False)
    assert [(e["kwargs"]["column"], e.get("unexpected_sample_ids")) for e in result.failed_expectations] == [
        ("document_length", ["over"])]


def test_an_empty_text_fails_on_every_kind(tmp_path):
    """``text_length >= 1`` still judges post-training rows: an empty rendered text is a broken row."""
    from datahub.qa import run_suites

    lake = Lake(tmp_path / "lake")
    fine = [f"fine pair {i}" for i in range(20)]  # distinct: the two equal empty texts stay under 5% duplicates
    lake.commit("samples", pa.table({"sample_id": ["c", "t", "d", *fine], "text": ["", "", "z" * 2_000_000, *fine],
                                     "kind": ["chat", "trajectory", "trajectory", *["preference"] * 20]}), txn="s/1")
    [result] = run_suites(lake, suites=["samples.v1"], commit=False)
    assert [(e["kwargs"]["column"], e.get("unexpected_sample_ids")) for e in result.failed_expectations] == [
        ("text_length", ["c", "t"])]


def test_qa_then_release_create_on_long_rollouts(lakes):
    """The reported path: `datahub qa` records a pass on the long rollouts, so `release create --require-qa`
    releases them."""
    from datahub.cli.main import app

    root = str(lakes["long-rollouts"].root)
    runner = CliRunner()
    qa = runner.invoke(app, ["qa", "--lake", root])
    assert qa.exit_code == 0, qa.output
    made = runner.invoke(app, ["release", "create", "rollouts-1", "--lake", root, "--require-qa", "--json"])
    assert made.exit_code == 0, made.output + str(made.exception)


def test_a_table_without_text_says_the_text_columns_are_derived_from_text(tmp_path):
    """``text_length``, ``document_length`` and ``text_id`` are derived: the error says from what, not that no
    column of that name is derived."""
    from datahub.qa import run_suites

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "body": ["a document under another name"]}), txn="s/1")
    [result] = run_suites(lake, suites=["samples.v1"], commit=False)
    errors = {e["kwargs"]["column"]: e["error"] for e in result.failed_expectations}
    for column in ("text_length", "document_length", "text_id"):
        assert f"{column!r} is derived from the text column, and this table has none" in errors[column], errors
        assert "columns here: body, sample_id" in errors[column]

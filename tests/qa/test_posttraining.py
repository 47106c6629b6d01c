"""Post-training QA (posttraining.v1 on the columns of datahub.qa.posttraining) on lakes built by the real pipeline
from chat, preference and trajectory JSONL (plus text): a clean mixed lake passes; a chat with an empty assistant
turn, a pair whose chosen equals its rejected reply, or a trajectory row with no steps fails on exactly that
expectation; Ray and Spark give the local verdicts; `datahub qa` runs the suite by default, shows it in --help and
--json; a suite naming a derived column the table cannot give names the file, the expectation and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.operator import BatchOperator, register
from datahub.pipeline.run import run_job
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)

CHATS = [
    {"messages": [{"role": "system", "content": "You answer questions about Linux."},
                  {"role": "user", "content": "How do I list the largest files under /var/log?"},
                  {"role": "assistant", "content": "Run `du -ah /var/log | sort -rh | head`."}]},
    {"messages": [{"role": "user", "content": "What does the sticky bit on /tmp do?"},
                  {"role": "assistant", "content": "Only a file's owner may delete or rename it."},
                  {"role": "user", "content": "How do I set it?"},
                  {"role": "assistant", "content": "Use `chmod +t DIR`."}]},
    {"messages": [{"role": "user", "content": "How full is the root filesystem?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "df", "arguments": "{\"path\": \"/\"}"}}]},
                  {"role": "tool", "tool_call_id": "c1", "content": "41% used"},
                  {"role": "assistant", "content": "The root filesystem is 41% full."}]},
    {"conversations": [{"from": "human", "value": "Which port does SSH use?"},
                       {"from": "gpt", "value": "Port 22 over TCP by default."}]},
]
PAIRS = [
    {"prompt": "Count the lines of all .py files.", "chosen": "find . -name '*.py' | xargs cat | wc -l",
     "rejected": "wc -l *.py", "score_chosen": 9, "score_rejected": 4},
    {"prompt": "Is `chmod -R 777 /` a good fix?", "chosen": "No: it breaks setuid programs and ssh.",
     "rejected": "Yes, it fixes every permission error."},
    {"chosen": [{"role": "user", "content": "Default SSH port?"}, {"role": "assistant", "content": "22."}],
     "rejected": [{"role": "user", "content": "Default SSH port?"}, {"role": "assistant", "content": "80."}]},
]
EPISODES = [
    {"episode_id": "ep-1", "steps": [
        {"observation": "df reports /var at 98%", "action": "du -sh /var/*", "reward": 0.0},
        {"observation": "/var/log 41G", "tool_call": {"name": "rotate_logs", "arguments": {"keep": 3}},
         "tool_result": "rotated 212 files", "reward": 0.5},
        {"observation": "df reports /var at 55%", "action": "echo done", "reward": 1.0, "done": True}]},
    {"episode_id": "ep-2", "steps": [
        {"observation": "nginx.service: failed", "action": "journalctl -u nginx -n 20"},
        {"observation": "port 80 in use", "action": "systemctl stop apache2", "reward": 1.0, "done": True}]},
]
TEXTS = ["The module reads the files given to it and returns their text.",
         "Every run is one logical commit per table with an idempotent transaction id."]

EMPTY_ASSISTANT = {"messages": [{"role": "user", "content": "Summarize the incident report."},
                                {"role": "assistant", "content": "   "}]}
SAME_PAIR = {"prompt": "Name a shell that ships with macOS.", "chosen": "zsh", "rejected": "zsh "}
CUT_EPISODE = {"episode_id": "cut-3", "steps": [{"observation": "disk full", "action": "rm -rf /tmp/cache"}]}


@register
class CutEpisodeSteps(BatchOperator):
    """Empties the steps of episodes whose id starts with ``cut-`` (a broken truncation operator): ingest refuses
    an empty ``steps`` list, so a step-less row reaches a lake only from an operator (or a merge) like this one."""

    name = "test_qa_cut_episode_steps"
    kinds = frozenset({"text", "chat", "preference", "trajectory"})

    def process(self, table: pa.Table) -> pa.Table:
        if "steps" not in table.column_names or not table.num_rows:
            return table
        steps = table.column("steps")
        cut = pc.fill_null(pc.starts_with(table.column("episode_id"), "cut-"), False)
        emptied = pc.if_else(cut, pa.scalar([], steps.type), steps)
        return table.set_column(table.schema.get_field_index("steps"), "steps", emptied)


@register
class NullNestedColumns(BatchOperator):
    """Nulls the nested column of a row of its kind (a broken operator or merge): ``messages`` of chats that mention
    an incident, ``rejected`` of pairs about macOS, ``steps`` of episodes whose id starts with ``null-``."""

    name = "test_qa_null_nested_columns"
    kinds = frozenset({"text", "chat", "preference", "trajectory"})

    def process(self, table: pa.Table) -> pa.Table:
        if not table.num_rows:
            return table
        hits = {"messages": lambda: pc.match_substring(table.column("text"), "incident"),
                "rejected": lambda: pc.match_substring(table.column("text"), "macOS"),
                "steps": lambda: pc.starts_with(table.column("episode_id"), "null-")}
        for name, hit in hits.items():
            if name in table.column_names:
                column = table.column(name)
                nulled = pc.if_else(pc.fill_null(hit(), False), pa.scalar(None, column.type), column)
                table = table.set_column(table.schema.get_field_index(name), name, nulled)
        return table


def _build(tmp_path: Path, name: str, *, chats=(), pairs=(), episodes=(), texts=(), qa: dict | None = None,
           lake_name: str | None = None, op: str = "test_qa_cut_episode_steps") -> Lake:
    """A lake written by run_job from JSONL files of each kind (no quality operators: QA is the only gate); with
    ``qa``, the job's ``qa:`` section, gated by ``datahub.qa.run_for_job`` as ``datahub run`` does (its counts on
    ``lake.qa``). ``lake_name``: the lake to write (default ``name``; another run's lake gets a second commit)."""
    inputs = tmp_path / f"{name}-in"
    inputs.mkdir()
    specs = []
    for kind, records in (("chat", chats), ("preference", pairs), ("trajectory", episodes)):
        if records:
            (inputs / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            specs.append({"uri": str(inputs / f"{kind}.jsonl"), "kind": kind})
    if texts:
        (inputs / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        specs.append({"uri": str(inputs / "text.jsonl")})
    raw: dict[str, Any] = {
        "name": name, "lake": {"root": str(tmp_path / (lake_name or name))}, "inputs": specs,
        "graph": {"cut": {"op": op}, "samples": {"sink": "samples", "after": ["cut"]}},
    }
    if qa is not None:
        raw["qa"] = qa
    from datahub.qa import run_for_job

    result = run_job(validate_job_spec(raw, source=f"{name}.yaml"), engine=ArrowEngine(), qa_gate=run_for_job)
    assert result.status == "succeeded", result.error
    assert result.counts["quarantined_total"] == 0, result.counts
    lake = Lake(tmp_path / (lake_name or name))
    lake.qa = result.counts.get("qa")
    return lake


def _failed(results) -> dict[str, list[tuple[str, Any]]]:
    return {r.suite: sorted((e["expectation"], e["kwargs"].get("column")) for e in r.failed_expectations)
            for r in results}


def test_a_clean_mixed_lake_passes_both_default_suites(tmp_path):
    from datahub.qa import run_suites

    lake = _build(tmp_path, "clean", chats=CHATS, pairs=PAIRS, episodes=EPISODES, texts=TEXTS)
    results = run_suites(lake, commit=False)
    assert [r.suite for r in results] == ["samples.v1", "posttraining.v1"]
    assert _failed(results) == {"samples.v1": [], "posttraining.v1": []}
    judged = {e["kwargs"]["column"]: e for e in results[1].results}
    assert all(e["success"] is True for e in judged.values())  # none skipped: every kind's columns are here
    # each check judged the rows of its own kind only (the others are null there)
    assert judged["messages_empty_assistant_turns"]["observed"]["element_count"] == lake.dataset("samples").count_rows()
    assert judged["chosen_equals_rejected"]["observed"]["unexpected_count"] == 0
    from datahub.qa import run_for_job  # a job's qa: gate with no suites named picks them as `datahub qa` does

    gate = run_for_job(lake, suites=None, table="samples", version=None, run_id="job-1")
    assert gate["success"] and set(gate["suites"]) == {"samples.v1", "posttraining.v1"}


def _sample_id(lake: Lake, marker: str) -> str:
    rows = lake.read("samples", columns=["sample_id", "text"]).to_pylist()
    [found] = [r["sample_id"] for r in rows if marker in r["text"]]
    return found


@pytest.mark.parametrize("bad, expectation, marker", [
    ({"chats": [EMPTY_ASSISTANT]}, ("expect_column_values_to_be_between", "messages_empty_assistant_turns"),
     "incident"),
    ({"pairs": [SAME_PAIR]}, ("expect_column_values_to_be_in_set", "chosen_equals_rejected"), "macOS"),
    ({"episodes": [CUT_EPISODE]}, ("expect_column_values_to_be_between", "steps_count"), "disk full"),
], ids=["empty-assistant-turn", "chosen-equals-rejected", "no-steps"])
def test_a_broken_record_fails_exactly_its_expectation(tmp_path, bad, expectation, marker):
    from datahub.qa import releasable, run_suites

    records = {"chats": CHATS, "pairs": PAIRS, "episodes": EPISODES, "texts": TEXTS}
    for key, extra in bad.items():
        records[key] = [*records[key], *extra]
    lake = _build(tmp_path, "bad", **records)
    results = run_suites(lake)
    assert _failed(results) == {"samples.v1": [], "posttraining.v1": [expectation]}
    [entry] = results[1].failed_expectations
    assert entry["observed"]["unexpected_count"] == 1
    assert entry["unexpected_sample_ids"] == [_sample_id(lake, marker)]  # which record to fix
    assert not releasable(lake, table="samples", version=lake.version("samples"))


@pytest.mark.parametrize("bad, expectation, marker", [
    ({"chats": [EMPTY_ASSISTANT]}, ("expect_column_values_to_be_between", "messages_assistant_turns"), "incident"),
    ({"pairs": [{"prompt": "Name a shell that ships with macOS.", "chosen": "zsh", "rejected": "bash"}]},
     ("expect_column_values_to_be_between", "rejected_turns"), "macOS"),
    ({"episodes": [{**CUT_EPISODE, "episode_id": "null-3"}]}, ("expect_column_values_to_be_between", "steps_count"),
     "disk full"),
], ids=["chat-messages-null", "preference-rejected-null", "trajectory-steps-null"])
def test_a_row_of_a_post_training_kind_with_a_null_nested_column_is_judged_as_empty(tmp_path, bad, expectation,
                                                                                    marker):
    """Its ``kind`` says which checks judge it: a null list counts as an empty one there (a row of another kind
    stays null and unjudged)."""
    from datahub.qa import run_suites

    records = {"chats": CHATS, "pairs": PAIRS, "episodes": EPISODES, "texts": TEXTS}
    for key, extra in bad.items():
        records[key] = [*records[key], *extra]
    lake = _build(tmp_path, "null", op="test_qa_null_nested_columns", **records)
    rows = lake.read("samples", columns=["kind", "messages", "rejected", "steps"]).to_pylist()
    assert sum(r[{"chat": "messages", "preference": "rejected", "trajectory": "steps"}.get(r["kind"], "kind")] is None
               for r in rows) == 1
    results = run_suites(lake, commit=False)
    assert _failed(results) == {"samples.v1": [], "posttraining.v1": [expectation]}
    [entry] = results[1].failed_expectations
    assert entry["observed"]["unexpected_count"] == 1
    assert entry["unexpected_sample_ids"] == [_sample_id(lake, marker)]


LEGIT_EMPTY_TURNS = [
    # ShareGPT with an empty system turn (OpenHermes-2.5 style)
    {"conversations": [{"from": "system", "value": ""}, {"from": "human", "value": "Which port does HTTPS use?"},
                       {"from": "gpt", "value": "443."}]},
    # a tool that printed nothing (mkdir succeeded), then the assistant answers
    {"messages": [{"role": "user", "content": "Create /srv/app."},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "c9", "type": "function",
                       "function": {"name": "sh", "arguments": "{\"cmd\": \"mkdir -p /srv/app\"}"}}]},
                  {"role": "tool", "tool_call_id": "c9", "content": ""},
                  {"role": "assistant", "content": "Created /srv/app."}]},
]


def test_empty_system_and_tool_turns_pass_the_default_gate_an_empty_assistant_turn_does_not(tmp_path):
    """posttraining.v1 gates on empty assistant turns (what SFT trains on); an empty system prompt or a tool that
    printed nothing is legitimate, and counted only in messages_empty_turns (for users' own suites)."""
    from datahub.qa import run_suites

    lake = _build(tmp_path, "legit", chats=[*CHATS, *LEGIT_EMPTY_TURNS], qa={})
    assert lake.qa["suites"]["posttraining.v1"] == {"success": True, "failed": 0}
    from datahub.qa.validate import validation_frame

    frame = validation_frame(lake.read("samples"))
    chats = frame[frame["messages_turns"].notna()]
    assert sorted(chats["messages_empty_turns"]) == [0, 0, 0, 0, 1, 1]
    assert sorted(chats["messages_empty_assistant_turns"]) == [0] * 6
    broken = _build(tmp_path, "broken", chats=[*CHATS, *LEGIT_EMPTY_TURNS, EMPTY_ASSISTANT])
    _, post = run_suites(broken, commit=False)
    assert [e["kwargs"]["column"] for e in post.failed_expectations] == ["messages_empty_assistant_turns"]


def test_a_jobs_qa_section_with_no_suites_gates_on_posttraining_v1(tmp_path):
    """`qa: {}` in a post-training job: run_job's gate runs samples.v1 and posttraining.v1 on the committed
    version, so a broken pair fails the run's QA (recorded, unreleasable) though the run itself succeeds."""
    from datahub.qa import releasable, results_for

    clean = _build(tmp_path, "clean", chats=CHATS, pairs=PAIRS, qa={})
    assert clean.qa["success"] is True
    assert clean.qa["suites"] == {"samples.v1": {"success": True, "failed": 0},
                                  "posttraining.v1": {"success": True, "failed": 0}}
    broken = _build(tmp_path, "broken", chats=CHATS, pairs=[*PAIRS, SAME_PAIR], qa={})
    assert broken.qa["success"] is False
    assert broken.qa["suites"]["posttraining.v1"] == {"success": False, "failed": 1}
    version = broken.version("samples")
    assert {r.suite: r.success for r in results_for(broken, table="samples", version=version)} == {
        "samples.v1": True, "posttraining.v1": False}
    assert not releasable(broken, table="samples", version=version)
    named = _build(tmp_path, "named", chats=CHATS, pairs=[*PAIRS, SAME_PAIR], qa={"suites": ["samples.v1"]})
    assert set(named.qa["suites"]) == {"samples.v1"}  # named suites only


def test_a_text_only_lake_runs_samples_v1_alone_with_todays_verdict(tmp_path):
    from datahub.config.suites import default_suites
    from datahub.qa import run_suites

    lake = _build(tmp_path, "text", texts=TEXTS)
    assert default_suites(lake.dataset("samples").schema.names) == ["samples.v1"]
    [result] = run_suites(lake, commit=False)
    [named] = run_suites(lake, suites=["samples.v1"], commit=False)
    assert (result.suite, result.success, result.results) == ("samples.v1", True, named.results)
    # a chat-only lake runs posttraining.v1 and skips the preference and trajectory checks (columns absent)
    chat = _build(tmp_path, "chat", chats=CHATS)
    _, post = run_suites(chat, commit=False)
    skipped = {e["kwargs"]["column"] for e in post.results if e["success"] is None}
    assert post.success and skipped == {"chosen_turns", "rejected_turns", "chosen_empty_turns",
                                        "rejected_empty_turns", "chosen_equals_rejected", "steps_count",
                                        "steps_within_episode"}


def _verdicts(results) -> list:
    return [(r.suite, r.success, sorted((e["expectation"], e["kwargs"].get("column"), e["success"])
                                        for e in r.results)) for r in results]


def test_ray_and_spark_give_the_streamed_verdicts(tmp_path, ray_engine, spark_engine):  # noqa: F811
    """All three broken records in one lake, committed by two runs (two data files): the streamed pass, Ray
    tasks per file, Great Expectations on Spark and GX on the whole frame agree on every expectation; a suite
    naming a column the table cannot give fails it with the same error on every engine."""
    from datahub.config.suites import load_suite
    from datahub.qa import run_suites
    from datahub.qa.validate import run_expectations, validation_frame

    _build(tmp_path, "first", chats=[*CHATS, EMPTY_ASSISTANT], pairs=PAIRS, texts=TEXTS, lake_name="all")
    lake = _build(tmp_path, "second", pairs=[SAME_PAIR], episodes=[*EPISODES, CUT_EPISODE], lake_name="all")
    assert len(lake.dataset("samples").files) >= 2
    typo = tmp_path / "typo.v1.json"
    typo.write_text(json.dumps({"name": "typo.v1", "expectations": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "messages_turns", "min_value": 1}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "steps_counts", "min_value": 1}}]}))
    suites = ["samples.v1", "posttraining.v1", str(typo)]
    local = run_suites(lake, suites=suites, commit=False)
    assert _failed(local)["posttraining.v1"] == [
        ("expect_column_values_to_be_between", "messages_empty_assistant_turns"),
        ("expect_column_values_to_be_between", "steps_count"),
        ("expect_column_values_to_be_in_set", "chosen_equals_rejected")]
    on_ray = run_suites(lake, suites=suites, commit=False, engine=ray_engine)
    on_spark = run_suites(lake, suites=suites, commit=False, engine=spark_engine)
    assert _verdicts(on_ray) == _verdicts(local)
    assert _verdicts(on_spark) == _verdicts(local)
    assert [r.results for r in on_ray] == [r.results for r in local]  # the same aggregates, merged

    def named(results) -> list:
        return [sorted((e["expectation"], e["kwargs"].get("column"), e.get("unexpected_sample_ids"),
                        e.get("unexpected_rows_without_sample_id")) for e in r.results) for r in results]

    assert named(on_spark) == named(local)  # which records to fix, on Spark too
    assert sum(bool(e.get("unexpected_sample_ids")) for r in local for e in r.results) >= 3
    # the same error, naming the expectation's index in its suite file, on every engine
    [error] = {next(e["error"] for e in r.results if e.get("error")) for r in (local[2], on_ray[2], on_spark[2])}
    assert error.startswith(f"{typo}: expectations[1]") and "did you mean 'steps_count'" in error
    frame = validation_frame(lake.read("samples"))
    _, whole = run_expectations(frame, load_suite("posttraining.v1"))
    assert sorted((e["expectation"], e["kwargs"].get("column"), e["success"]) for e in whole) == _verdicts(local)[1][2]


def test_qa_cli_runs_posttraining_by_default_and_shows_it_in_help_and_json(tmp_path):
    from datahub.cli.main import app
    from datahub.qa.posttraining import DERIVED

    runner = CliRunner()
    help_text = " ".join(runner.invoke(app, ["qa", "--help"], terminal_width=200).output.split())
    assert "posttraining.v1" in help_text and "unexpected_sample_ids" in help_text
    missing = [name for name in DERIVED if name not in help_text]
    assert not missing, missing
    lake = _build(tmp_path, "cli", chats=CHATS, pairs=[*PAIRS, SAME_PAIR], texts=TEXTS)
    out = runner.invoke(app, ["qa", "--lake", str(lake.root), "--no-record", "--json"])
    assert out.exit_code == 1, out.output
    report = json.loads(out.stdout)
    assert [r["suite"] for r in report["results"]] == ["samples.v1", "posttraining.v1"]
    [failed] = report["results"][1]["failed_expectations"]
    assert failed["kwargs"] == {"column": "chosen_equals_rejected", "value_set": [False]}
    assert failed["observed"]["partial_unexpected_list"] == [True]
    text = runner.invoke(app, ["qa", "--lake", str(lake.root), "--no-record"], terminal_width=200)
    assert text.exit_code == 1
    assert "posttraining.v1 (v1) on samples@" in text.output and "FAILED" in text.output
    assert "FAIL expect_column_values_to_be_in_set chosen_equals_rejected unexpected=1/" in text.output
    assert f"sample_id {_sample_id(lake, 'macOS')}" in text.output
    assert "skip 2 optional expectations: columns not in this table (no trajectory samples): steps_count, " \
           "steps_within_episode" in " ".join(text.output.split())
    assert failed["unexpected_sample_ids"] == [_sample_id(lake, "macOS")]
    named = runner.invoke(app, ["qa", "--lake", str(lake.root), "--no-record", "--json", "--suite", "samples.v1"])
    assert named.exit_code == 0 and [r["suite"] for r in json.loads(named.stdout)["results"]] == ["samples.v1"]


def test_a_suite_naming_a_column_the_table_cannot_give_says_where_and_how_to_fix(tmp_path):
    from datahub.qa import run_suites

    lake = _build(tmp_path, "chat", chats=CHATS)
    suite = tmp_path / "pairs.v1.json"
    suite.write_text(json.dumps({"name": "pairs.v1", "expectations": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "messages_turn", "min_value": 2}},
        {"type": "expect_column_values_to_be_in_set",
         "kwargs": {"column": "chosen_equals_rejected", "value_set": [False]}},
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "messages_turns", "min_value": 2}},
    ]}))
    [result] = run_suites(lake, suites=[str(suite)], commit=False)
    typo, absent, ok = result.results
    assert not result.success and ok["success"] is True
    assert typo["success"] is False and absent["success"] is False
    assert typo["error"].startswith(f"{suite}: expectations[0] (expect_column_values_to_be_between on 'messages_turn')")
    assert "did you mean 'messages_turns'" in typo["error"] and "fix kwargs.column" in typo["error"]
    assert absent["error"].startswith(f"{suite}: expectations[1] (expect_column_values_to_be_in_set on "
                                      f"'chosen_equals_rejected')")
    assert "derived from chosen, rejected (preference samples)" in absent["error"]
    assert '"meta": {"optional": true}' in absent["error"]


def test_derived_columns_stream_in_batches_as_they_compute_on_the_whole_table(tmp_path):
    """Batch boundaries change nothing: one-row batches give the whole table's values (offsets, slices)."""
    from datahub.qa.validate import validation_batch, validation_columns

    lake = _build(tmp_path, "all", chats=[*CHATS, EMPTY_ASSISTANT], pairs=[*PAIRS, SAME_PAIR],
                  episodes=[*EPISODES, CUT_EPISODE], texts=TEXTS)
    table = lake.read("samples")
    wanted = set(validation_columns(table.schema))
    whole = validation_batch(table, wanted)
    rows = pa.concat_tables(validation_batch(table.slice(i, 1), wanted) for i in range(table.num_rows))
    assert rows.to_pylist() == whole.to_pylist()
    values = {name: whole.column(name).to_pylist() for name in ("chosen_equals_rejected", "steps_count",
                                                                 "messages_empty_turns", "steps_within_episode")}
    assert sorted(v for v in values["chosen_equals_rejected"] if v is not None) == [False] * len(PAIRS) + [True]
    assert sorted(v for v in values["steps_count"] if v is not None) == [0, 2, 3]
    assert sorted(v for v in values["messages_empty_turns"] if v is not None) == [0] * len(CHATS) + [1]
    assert sorted(v for v in values["steps_within_episode"] if v is not None) == [True] * 3
    # the pass reads the nested columns it derives from, their rows' kind and the ids it names, never the text
    from datahub.config.suites import load_suite
    from datahub.qa.validate import plan_pass

    plan = plan_pass(table.schema, [load_suite("posttraining.v1")], total_rows=table.num_rows)
    assert set(plan.read) == {"messages", "chosen", "rejected", "steps", "step_offset", "episode_steps", "sample_id",
                              "kind"}


def test_wide_rows_are_read_in_fewer_rows_a_batch_with_the_same_verdicts(tmp_path, monkeypatch):
    """A trajectory row can hold 1,024 steps and as much rendered text: a batch ends once its reads hold
    BATCH_BYTES of decoded columns, whatever rows a file has; batch boundaries change no verdict."""
    import datahub.qa.validate as validate
    from datahub.qa import run_suites

    lake = _build(tmp_path, "wide", chats=[*CHATS, EMPTY_ASSISTANT], pairs=[*PAIRS, SAME_PAIR],
                  episodes=[*EPISODES, CUT_EPISODE], texts=TEXTS)
    rows = lake.dataset("samples").count_rows()

    def batches_seen() -> tuple[list[int], list]:
        seen: list[int] = []
        results = run_suites(lake, commit=False, progress=lambda stage, done, total: seen.append(done))
        return seen, results

    whole, expected = batches_seen()
    assert whole[-1] == rows and len(set(whole) - {0}) == 1  # 4,096-row batches: one
    monkeypatch.setattr(validate, "BATCH_BYTES", 1)  # one read a batch
    monkeypatch.setattr(validate, "READ_ROWS", 1)  # one row a read
    narrow, got = batches_seen()
    assert sorted(set(narrow) - {0}) == list(range(1, rows + 1))
    assert [r.results for r in got] == [r.results for r in expected]


def test_columns_named_like_post_training_ones_but_of_other_types_run_samples_v1_alone(tmp_path):
    """A table from another writer whose ``steps`` is a count and ``messages`` JSON text: no derived column reads
    them, so the default suites are samples.v1 alone (which passes, as before posttraining.v1); naming
    posttraining.v1 gives, per expectation, an error naming the column, its type and the type it needs."""
    from datahub.qa import run_suites

    lake = Lake(tmp_path / "other")
    lake.commit("samples", pa.table({
        "sample_id": ["a", "b"], "text": ["The first document of the other writer.", "And its second document."],
        "kind": ["text", "text"], "steps": pa.array([3, 4], pa.int64()),
        "messages": ['[{"role": "user", "content": "hi"}]', None]}), txn="other/1")
    [result] = run_suites(lake, commit=False)
    assert (result.suite, result.success) == ("samples.v1", True)
    [named] = run_suites(lake, suites=["posttraining.v1"], commit=False)
    assert not named.success
    errors = {e["kwargs"]["column"]: e.get("error") for e in named.results}
    assert all(errors[c] is None for c in ("chosen_turns", "chosen_equals_rejected"))  # no such columns: skipped
    wrong = {c: e for c, e in errors.items() if e}
    assert set(wrong) == {"messages_assistant_turns", "messages_empty_assistant_turns", "messages_last_role",
                          "steps_count", "steps_within_episode"}
    assert "column 'steps' is int64" in wrong["steps_count"] and "a list of structs" in wrong["steps_count"]
    assert "column 'messages' is string" in wrong["messages_last_role"]
    assert "role, content, tool_calls" in wrong["messages_last_role"]


def test_a_batch_holds_about_batch_bytes_of_decoded_columns_in_a_mixed_file_on_every_path(tmp_path, monkeypatch):
    """One file of many short texts and a dense run of wide trajectory rows (the samples table holds every kind in
    input order): the footers' average bytes a row hide the wide run, so batches are bounded by the decoded bytes
    read, in the local pass, the Ray task (``_FileAggregates``) and the Spark read (``_FileValidationColumns``) alike;
    verdicts do not change."""
    import datahub.qa.engine as engine
    import datahub.qa.validate as validate
    from datahub.config.suites import load_suite
    from datahub.kinds.posttraining import STEPS

    short = 2_000
    wide = [[{"observation": f"row {r} step {s} " + "x" * 480, "reward": 1.0} for s in range(64)] for r in range(40)]
    table = pa.table({
        "sample_id": [f"s{i:05d}" for i in range(short + len(wide))],
        "kind": ["text"] * short + ["trajectory"] * len(wide),
        "text": [f"short text {i}" for i in range(short)] + [f"episode {r}" for r in range(len(wide))],
        "steps": pa.array([None] * short + wide, STEPS),
        "step_offset": pa.array([None] * short + [0] * len(wide), pa.int64()),
        "episode_steps": pa.array([None] * short + [64] * len(wide), pa.int64()),
    })
    lake = Lake(tmp_path / "mixed")
    lake.commit("samples", table, txn="mixed/1")
    limit = 256 * 2**10  # the wide run is ~1.3 MB: five times this; the file averages ~0.7 KB a row
    monkeypatch.setattr(validate, "BATCH_BYTES", limit)
    monkeypatch.setattr(validate, "READ_ROWS", 4)  # a read of wide rows (~128 KB) is under the limit, as 64 are
    # under 32 MiB for rows of up to ~0.5 MB (1,024 steps)
    seen: list[int] = []
    batch_of = validate.validation_batch

    def spy(batch, wanted):
        seen.append(batch.nbytes)
        return batch_of(batch, wanted)

    monkeypatch.setattr(validate, "validation_batch", spy)
    monkeypatch.setattr(engine, "validation_batch", spy)
    from datahub.qa import run_suites

    suites = [load_suite("samples.v1"), load_suite("posttraining.v1")]
    [_, post] = run_suites(lake, suites=["samples.v1", "posttraining.v1"], commit=False)
    assert post.success and len(seen) > 1
    assert max(seen) <= 2 * limit, ("local", max(seen), limit)
    dataset = lake.dataset("samples")
    [path] = dataset.files
    plan = validate.plan_pass(pa.schema(dataset.schema), suites, total_rows=table.num_rows)
    seen.clear()
    version = lake.version("samples")
    engine._FileAggregates(lake, "samples", version, plan)((path, 0))  # what each Ray task runs
    assert len(seen) > 1 and max(seen) <= 2 * limit, ("ray task", max(seen), limit)
    seen.clear()
    list(engine._FileValidationColumns(lake, "samples", version, plan.read, plan.wanted, plan.batch_rows)((0, path)))  # Spark
    assert len(seen) > 1 and max(seen) <= 2 * limit, ("spark read", max(seen), limit)


def test_qa_cli_says_which_source_columns_a_skipped_check_lacks(tmp_path):
    """A trajectory table without step_offset/episode_steps (another writer) skips steps_within_episode for lack of
    those columns, not for lack of trajectory samples, which it has."""
    from datahub.cli.main import app
    from datahub.kinds.posttraining import STEPS

    lake = Lake(tmp_path / "steps")
    lake.commit("samples", pa.table({
        "sample_id": ["a" * 32], "kind": ["trajectory"], "text": ["df reports /var at 98%"],
        "steps": pa.array([[{"observation": "df reports /var at 98%", "action": "du -sh /var/*"}]], STEPS)}),
        txn="steps/1")
    out = CliRunner().invoke(app, ["qa", "--lake", str(lake.root), "--no-record"], terminal_width=200)
    text = " ".join(out.output.split())
    assert out.exit_code == 0, out.output
    assert "(no step_offset, episode_steps column): steps_within_episode" in text
    assert "(no trajectory samples): steps_within_episode" not in text


def test_release_create_require_qa_asks_for_the_tables_default_suites(tmp_path):
    """`release create --require-qa` on a chat/preference table checked by samples.v1 alone is refused, naming
    posttraining.v1 and the qa command; once `datahub qa` ran the default suites, it releases. Text tables still
    need samples.v1 only."""
    from datahub.cli.main import app

    runner = CliRunner()
    lake = _build(tmp_path, "chat", chats=CHATS, pairs=PAIRS, qa={"suites": ["samples.v1"]})
    refused = runner.invoke(app, ["release", "create", "r1", "--lake", str(lake.root), "--require-qa"],
                            terminal_width=200)
    assert refused.exit_code != 0
    message = " ".join((refused.output + str(refused.exception)).split())  # the app raises; main() prints it
    assert "no QA results of posttraining.v1" in message and "suites that ran: samples.v1" in message, message
    assert f"datahub qa --lake {lake.root} --table samples" in message, message
    qa = runner.invoke(app, ["qa", "--lake", str(lake.root)])
    assert qa.exit_code == 0, qa.output
    made = runner.invoke(app, ["release", "create", "r1", "--lake", str(lake.root), "--require-qa", "--json"])
    assert made.exit_code == 0, made.output
    assert set(json.loads(made.output)["details"]["qa_suites"]) == {"samples.v1", "posttraining.v1"}
    text = _build(tmp_path, "text", texts=TEXTS, qa={"suites": ["samples.v1"]})
    plain = runner.invoke(app, ["release", "create", "t1", "--lake", str(text.root), "--require-qa"])
    assert plain.exit_code == 0, plain.output
    # any suite still satisfies --require-qa on its samples.v1 part: a chat table checked by posttraining.v1 alone
    alone = _build(tmp_path, "alone", chats=CHATS, qa={"suites": ["posttraining.v1"]})
    only = runner.invoke(app, ["release", "create", "a1", "--lake", str(alone.root), "--require-qa"])
    assert only.exit_code == 0, only.output + str(only.exception)

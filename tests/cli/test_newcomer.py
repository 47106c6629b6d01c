"""The friction a new user met (issue 21): output that is readable when piped, progress in logs,
a quarantine listing, error text printed as written, one --lake convention, and exit codes that
tell a script when a lookup found nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from datahub.cli.lake_option import lake_ref
from datahub.cli.output import _LogLines, progress
from datahub.engines.arrow import ArrowEngine
from datahub.errors import SpecError
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of

REPO = Path(__file__).resolve().parents[2]


def datahub(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as cron runs it: stdout and stderr are pipes, not a terminal."""
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})})


@pytest.fixture(scope="module")
def lake_with_runs(tmp_path_factory) -> tuple[Path, str, Path]:
    """A lake after one run with good, broken and text-less records (the in-process Arrow engine)."""
    from datahub.config.spec import validate_job_spec

    root = tmp_path_factory.mktemp("newcomer")
    inputs = root / "in"
    inputs.mkdir()
    good = [f"document {i} about rivers, mountains and the long history of the valley towns" for i in range(3)]
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in good) + "{broken\n" + '{"text": null}\n')
    (inputs / "empty.jsonl.zst").write_bytes(b"")
    spec = validate_job_spec({"name": "a-job-with-a-rather-long-name-for-wrapping", "lake": {"root": str(root / "lake")},
                              "inputs": [{"uri": str(inputs / "*.jsonl*")}], "graph": {"samples": {"sink": "samples"}}})
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    return root / "lake", result.run_id, inputs / "a.jsonl"


def test_piped_tables_never_wrap_or_cut_ids(lake_with_runs):
    lake, run_id, _ = lake_with_runs
    out = datahub("runs", "--lake", str(lake))
    assert out.returncode == 0, out.stderr
    assert run_id in out.stdout and "a-job-with-a-rather-long-name-for-wrapping" in out.stdout
    assert "…" not in out.stdout
    row = next(line for line in out.stdout.splitlines() if run_id in line)
    assert "succeeded" in row  # one row per run: nothing wrapped onto a second line


def test_runs_of_an_unknown_job_name_the_jobs_there(lake_with_runs):
    lake, _, _ = lake_with_runs
    out = datahub("runs", "--lake", str(lake), "--job", "a-job-with-a-typo")
    assert out.returncode == 0 and "no runs recorded" in out.stdout
    assert "(jobs there: a-job-with-a-rather-long-name-for-wrapping)" in out.stdout, out.stdout


def test_an_empty_json_answer_to_a_mistyped_filter_says_why_on_stderr(lake_with_runs):
    """`runs --job TYPO --json` printed `[]` and `quarantine --reason TYPO --json` no reasons, nothing else: a script's
    log could not tell a typo from a clean job. The JSON is unchanged; the text mode's hint goes to stderr."""
    lake, _, _ = lake_with_runs
    runs = datahub("runs", "--lake", str(lake), "--job", "a-job-with-a-typo", "--json")
    assert runs.returncode == 0 and json.loads(runs.stdout) == []
    assert "note: no runs recorded" in runs.stderr and "(jobs there: a-job-with-a-rather-long-name" in runs.stderr
    typo = datahub("quarantine", "--lake", str(lake), "--reason", "invalid_jsn", "--json")
    assert typo.returncode == 0 and json.loads(typo.stdout)["reasons"] == []
    assert "note: nothing quarantined" in typo.stderr and "(reasons there: invalid_json" in typo.stderr, typo.stderr
    clean = datahub("runs", "--lake", str(lake), "--json")
    assert clean.stderr == "" and len(json.loads(clean.stdout)) == 1


def test_the_lake_is_accepted_as_option_and_deprecated_positional(lake_with_runs):
    lake, run_id, _ = lake_with_runs
    new = datahub("runs", "--lake", str(lake), "--json")
    old = datahub("runs", str(lake), "--json")
    assert new.returncode == old.returncode == 0, old.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)
    assert "deprecated" not in new.stderr and f"use `datahub runs --lake {lake}`" in old.stderr
    table = datahub("inspect", "--lake", str(lake), "samples", "--json")
    assert table.returncode == 0, table.stderr and list(json.loads(table.stdout)["tables"]) == ["samples"]
    with pytest.raises(SpecError, match="two lakes given"):
        lake_ref("/a", "/b", command="runs")
    with pytest.raises(SpecError, match="no lake given"):
        lake_ref(None, None, command="qa")
    with pytest.raises(SpecError, match="--lake is empty"):
        lake_ref(None, "", command="qa")


def test_quarantine_command_counts_by_reason_with_examples(lake_with_runs):
    lake, run_id, source = lake_with_runs
    out = datahub("quarantine", "--lake", str(lake), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["total"] == 3
    by_reason = {r["reason"]: r for r in summary["reasons"]}
    assert {k: v["records"] for k, v in by_reason.items()} == {"invalid_json": 1, "missing_text_field": 1, "invalid_stream": 1}
    example = by_reason["missing_text_field"]["examples"][0]
    assert example["source_uri"].endswith("a.jsonl") and example["source_offset"] == 5 and example["run_id"] == run_id
    assert example["detail"] == "field 'text' is null"
    text = datahub("quarantine", "--lake", str(lake), "--reason", "invalid_json")
    assert text.returncode == 0 and "invalid_json" in text.stdout and "missing_text_field" not in text.stdout
    assert f"{source}:4" in text.stdout
    typo = datahub("quarantine", "--lake", str(lake), "--reason", "invalid_jsn")  # a typo names what is there
    assert typo.returncode == 0 and "with reason invalid_jsn (reasons there: invalid_json, invalid_stream, " \
                                    "missing_text_field)" in typo.stdout, typo.stdout


def test_lineage_of_an_unknown_sample_or_source_exits_non_zero(lake_with_runs):
    lake, _, source = lake_with_runs
    known = Lake(lake).read("samples", columns=["sample_id"]).column("sample_id")[0].as_py()
    assert datahub("lineage", known, "--lake", str(lake)).returncode == 0
    unknown = datahub("lineage", "0" * 64, "--lake", str(lake))
    assert unknown.returncode == 1 and "no lineage events" in unknown.stdout
    assert datahub("lineage", "--source", str(source), "--lake", str(lake)).returncode == 0
    missing = datahub("lineage", "--source", str(source) + ".typo", "--lake", str(lake), "--json")
    assert missing.returncode == 1 and "no record of" in missing.stderr


def test_error_text_is_printed_as_written_not_as_markup(tmp_path):
    storage = tmp_path / "storage.yaml"
    storage.write_text("tiers:\n  Bad Tier:\n    kind: cfs\n    path: /tmp/x\n")
    out = datahub("tier", "plan", "--lake", str(tmp_path / "lake"), "--storage", str(storage))
    assert out.returncode == 2
    assert "must match [a-z][a-z0-9_-]*" in out.stderr, out.stderr
    assert "\x1b[" not in out.stderr  # piped: no colour codes


def test_a_take_down_reason_in_brackets_prints_as_given(tmp_path):
    """Rich took '[legal]' in a redact reason for markup: redact, release show and lineage printed ' takedown #7'."""
    from datahub.config.spec import validate_job_spec
    from datahub.release.create import create_release

    source = tmp_path / "a.jsonl"
    source.write_text("".join(json.dumps({"text": f"document {i} about the valley towns"}) + "\n" for i in range(2)))
    spec = validate_job_spec({"name": "b", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(source)}],
                              "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    create_release(Lake(tmp_path / "lake"), "r1")
    sample = sample_id_of("document 0 about the valley towns")
    lake = ["--lake", str(tmp_path / "lake")]
    redact = datahub("release", "redact", "r2", "--from", "r1", "--sample", sample, "--reason", "[legal] takedown #7", *lake)
    assert redact.returncode == 0, redact.stderr
    assert "reason        [legal] takedown #7" in redact.stdout, redact.stdout
    assert "'reason': '[legal] takedown #7'" in datahub("release", "show", "r2", *lake).stdout
    assert "reason redacted: [legal] takedown #7" in datahub("lineage", sample, *lake).stdout
    assert "redacted: [legal] takedown #7" in datahub("lineage", "--source", str(source), *lake).stdout


def test_run_check_lists_the_inputs(tmp_path):
    out = datahub("run", "jobs/demo.yaml", "--check", "--lake", str(tmp_path / "lake"))
    assert out.returncode == 0, out.stderr
    listed = [line.strip().split("  ")[0] for line in out.stdout.splitlines() if line.startswith("  ")]
    assert listed and all(Path(uri).exists() for uri in listed)
    assert f"{len(listed)} input files" in out.stdout


def test_progress_is_log_lines_when_not_a_terminal(capsys):
    with progress("run demo") as update:
        assert isinstance(update, _LogLines)
        update("rows", 10)
        update("rows", 20)  # within LOG_EVERY_SECONDS of the first: not repeated until the stage ends
        update("qa", 0)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0].endswith("run demo: rows 10 (0s)") and "run demo: rows 20" in lines[1]
    assert "run demo: qa 0" in lines[2]


def test_qa_prints_its_rows_as_log_lines_when_piped(lake_with_runs):
    """A QA pass over a large table takes minutes: like a run, it is never silent in a cron log."""
    lake, _, _ = lake_with_runs
    out = datahub("qa", "--lake", str(lake), "--no-record")
    assert out.returncode == 0, out.stderr
    assert "qa samples: rows 0/3" in out.stderr and "passed" in out.stdout
    quiet = datahub("qa", "--lake", str(lake), "--no-record", "--json")
    assert "rows" not in quiet.stderr and json.loads(quiet.stdout)["success"] is True


def test_report_prints_its_rows_as_log_lines_when_piped(lake_with_runs, tmp_path):
    lake, _, _ = lake_with_runs
    out = datahub("report", "--lake", str(lake), "--out", str(tmp_path / "report"))
    assert out.returncode == 0, out.stderr
    assert "report samples: rows 0/3" in out.stderr and "report written" in out.stdout
    seen: list[tuple[str, int, int | None]] = []
    from datahub.report import build_report

    build_report(Lake(lake), out_dir=tmp_path / "again", progress=lambda *call: seen.append(call))
    assert seen[0] == ("rows", 0, 3) and seen[-1] == ("rows", 3, 3)


def test_quarantine_prints_its_scan_as_log_lines_when_piped(lake_with_runs):
    """`datahub quarantine` streams the whole quarantine table (millions of rows on a crawl): it was silent until
    the end; now its scan shows like report's and lineage --source's, and --json stays quiet."""
    lake, _, _ = lake_with_runs
    out = datahub("quarantine", "--lake", str(lake))
    assert out.returncode == 0, out.stderr
    assert f"quarantine {lake}: rows scanned 3" in out.stderr and f"quarantine {lake}: examples 3/3" in out.stderr
    assert "invalid_json" in out.stdout and "rows scanned" not in out.stdout
    quiet = datahub("quarantine", "--lake", str(lake), "--json")
    assert quiet.returncode == 0 and quiet.stderr == "" and json.loads(quiet.stdout)["total"] == 3


def test_release_commands_print_their_passes_as_log_lines_when_piped(tmp_path):
    """release create, redact, merge and diff printed nothing until done (minutes at real sizes)."""
    from datahub.evalset import add_evalset
    from tests.evalset.helpers import write_evalset
    from tests.release.helpers import add_samples

    texts = [f"document number {i} about rivers, bridges and the towns along them" for i in range(5)]
    lake = Lake(tmp_path / "lake")
    add_samples(lake, texts, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    root = str(lake.root)
    created = datahub("release", "create", "r1", "--lake", root)
    assert created.returncode == 0, created.stderr
    assert "release create r1: eval-set check 5/5" in created.stderr
    assert "release create r1: samples 0/5" in created.stderr and "release r1 created" in created.stdout
    redacted = datahub("release", "redact", "r2", "--from", "r1", "--sample", sample_id_of(texts[0]), "--reason", "PII",
                       "--lake", root)
    assert redacted.returncode == 0 and "release redact r2: write 0/4" in redacted.stderr, redacted.stderr
    merged = datahub("release", "merge", "m1", "--from", "r1", "--from", "r2", "--lake", root)
    assert merged.returncode == 0 and "release merge m1: inputs, pass 1 0/9" in merged.stderr, merged.stderr
    diffed = datahub("release", "diff", "r1", "r2", "--lake", root)
    assert diffed.returncode == 0 and "release diff r1 r2: read r1 0/5" in diffed.stderr, diffed.stderr
    quiet = datahub("release", "diff", "r1", "r2", "--lake", root, "--json")
    assert quiet.stderr == "" and json.loads(quiet.stdout)["removed"] == 1


def test_qa_reports_rows_done_through_its_python_api(lake_with_runs):
    from datahub.lake import Lake
    from datahub.qa import run_suites

    lake, _, _ = lake_with_runs
    seen: list[tuple[str, int, int | None]] = []
    run_suites(Lake(lake), suites=["samples.v1"], commit=False, progress=lambda *call: seen.append(call))
    assert seen[0] == ("rows", 0, 3) and seen[-1] == ("rows", 3, 3)


def test_a_run_prints_phases_and_the_stats_sink(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(json.dumps({"text": f"a document about topic {i} and more words"}) + "\n"
                                                     for i in range(5)))
    job = tmp_path / "job.yaml"
    job.write_text(f"name: stats-job\nengine: {{kind: ray, num_cpus: 1}}\nlake: {{root: {tmp_path / 'lake'}}}\n"
                   f"inputs: [{{uri: {tmp_path / 'in' / '*.jsonl'}}}]\n"
                   "graph:\n  normalize: {op: normalize_text}\n  samples: {sink: samples, after: [normalize]}\n"
                   "  stats: {sink: stats, after: [normalize]}\n")
    out = datahub("run", str(job))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "run stats-job: rows" in out.stderr  # log-style progress in a non-terminal
    stats = next(line for line in out.stdout.splitlines() if line.strip().startswith("stats "))
    assert "5 rows" in stats and "a.jsonl: 5" in stats
    runs = Lake(tmp_path / "lake").read("runs").to_pylist()
    assert runs[0]["status"] == "succeeded"


def test_no_colour_codes_in_runs_error(tmp_path, ray_engine):
    from datahub.config.spec import validate_job_spec
    from datahub.operator import BatchOperator, register

    @register
    class _FailsInATask(BatchOperator):
        name = "test_fails_in_a_task"

        def process(self, table: pa.Table) -> pa.Table:
            raise ValueError("tier names must match [a-z][a-z0-9_-]*")

    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "one document"}) + "\n")
    spec = validate_job_spec({"name": "fails", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(tmp_path / "a.jsonl")}],
                              "graph": {"bad": {"op": "test_fails_in_a_task"}, "samples": {"sink": "samples", "after": ["bad"]}}})
    with pytest.raises(Exception):
        run_job(spec, engine=ray_engine)
    error = Lake(tmp_path / "lake").read("runs").column("error")[0].as_py()
    assert "must match [a-z][a-z0-9_-]*" in error and "\x1b" not in error


def test_tier_plan_names_the_rule_that_moves_a_release(tmp_path):
    from typer.testing import CliRunner

    from datahub.cli.main import app
    from tests.export.helpers import make_lake

    lake = str(tmp_path / "lake")
    make_lake(lake, 20)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs: {{kind: cfs, path: {tmp_path / 'cfs'}}}\n  cfs2: {{kind: cfs, path: {tmp_path / 'cfs2'}}}\n"
                       "policy:\n  classes: {hot: [cfs, cfs2], warm: [cfs]}\n")
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, f"{args}: {result.output} {result.exception!r}"
        return result.stdout

    ok("release", "create", "r1", "--lake", lake)
    ok("export", "r1", "--lake", lake, "--tier", "cfs", "--storage", str(storage))
    assert "nothing to move" in ok("tier", "plan", "--lake", lake, "--storage", str(storage))  # warm: stays on cfs
    ok("release", "promote", "r1", "--channel", "stable", "--lake", lake)
    plan = ok("tier", "plan", "--lake", lake, "--storage", str(storage))
    assert "r1: copy cfs -> cfs2" in plan and "why: class hot: channel stable (policy.hot_channels)" in plan
    assert "policy.classes.hot = ['cfs', 'cfs2']" in plan
    rules = json.loads(ok("tier", "plan", "--lake", lake, "--storage", str(storage), "--release", "r1", "--tiers", "cfs2",
                          "--json"))["rules"]
    assert rules == {"r1": "--tiers given on the command line"}


def test_tier_plan_gives_a_table_export_the_rule_of_its_class(tmp_path):
    """An export of a bare table version has no release record: the plan dates it from its manifest (class warm),
    and the printed rule must be that one, not 'class cold: never read' beside '[class warm]'."""
    from typer.testing import CliRunner

    from datahub.cli.main import app
    from tests.export.helpers import make_lake

    lake = str(tmp_path / "lake")
    make_lake(lake, 5)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs: {{kind: cfs, path: {tmp_path / 'cfs'}}}\n  cfs2: {{kind: cfs, path: {tmp_path / 'cfs2'}}}\n"
                       "policy:\n  classes: {warm: [cfs2], cold: [cfs2]}\n  cold_if_unread_days: 180\n")
    runner = CliRunner()
    exported = runner.invoke(app, ["export", "t1", "--table", "samples", "--lake", lake, "--tier", "cfs", "--storage", str(storage)])
    assert exported.exit_code == 0, exported.output
    plan = runner.invoke(app, ["tier", "plan", "--lake", lake, "--storage", str(storage), "--json"])
    assert plan.exit_code == 0, plan.output
    result = json.loads(plan.stdout)
    assert {m["storage_class"] for m in result["moves"]} == {"warm"}
    assert result["rules"]["t1"].startswith("class warm: "), result["rules"]


def test_tier_apply_of_a_mistyped_release_names_the_exports_and_the_close_ones(tmp_path):
    """`tier apply --release corpus-v9` (a typo) said "no export manifest ...; run `datahub export` first", which
    sends the user to export a release that does not exist; a release not exported yet keeps that advice."""
    from typer.testing import CliRunner

    from datahub.cli.main import app
    from datahub.release import create_release
    from tests.export.helpers import make_lake

    lake = str(tmp_path / "lake")
    make_lake(lake, 5)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs: {{kind: cfs, path: {tmp_path / 'cfs'}}}\n")
    runner = CliRunner()
    exported = runner.invoke(app, ["export", "corpus-v1", "--table", "samples", "--lake", lake, "--tier", "cfs",
                                   "--storage", str(storage)])
    assert exported.exit_code == 0, exported.output
    typo = runner.invoke(app, ["tier", "apply", "--lake", lake, "--storage", str(storage), "--release", "corpus-v9"])
    assert str(typo.exception) == (f"no release or export 'corpus-v9' in lake {lake} (exported there: corpus-v1); "
                                   "did you mean 'corpus-v1'?")  # the CLI prints it as 'error: ...', exit 2
    create_release(Lake(lake), "corpus-v2")
    unexported = runner.invoke(app, ["tier", "plan", "--lake", lake, "--storage", str(storage), "--release", "corpus-v2"])
    assert "run `datahub export` first" in str(unexported.exception), unexported.output


def test_lineage_fate_of_a_redacted_sample_is_redacted(tmp_path, job_spec):
    from typer.testing import CliRunner

    from datahub.cli.main import app
    from datahub.release import create_release, redact
    from datahub.sample_id import sample_id_of

    texts = ["a kept document about the river delta", "a private document with a phone number 555 0100"]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    spec = job_spec(inputs=[{"uri": str(tmp_path / "a.jsonl")}])
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(spec.lake.root)
    create_release(lake, "r1")
    secret = sample_id_of(texts[1])
    redact(lake, "r2", source="r1", sample_ids=[secret], reason="PII")
    runner = CliRunner()
    story = runner.invoke(app, ["lineage", secret, "--lake", str(lake.root)])
    assert story.exit_code == 0 and "fate: redacted" in story.stdout, story.output
    by_source = json.loads(runner.invoke(app, ["lineage", "--source", str(tmp_path / "a.jsonl"), "--lake", str(lake.root),
                                               "--json"]).stdout)
    assert by_source["counts"] == {"kept": 1, "redacted": 1}
    assert {r["sample_id"]: r["fate"] for r in by_source["records"]}[secret] == "redacted"

"""Bad input a new user types, followed literally from the README: a clean `error:` line that names the
path, field or value and the fix, exit status 2, never a Python traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli.conftest import REPO, datahub


def assert_clean_error(out: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert out.stderr.startswith("error: "), out.stderr
    for text in expected:
        assert text in out.stderr, out.stderr


def test_a_lake_root_that_cannot_be_made_is_an_error_naming_it(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory\n")
    out = datahub("run", "jobs/demo.yaml", "--lake", str(a_file / "lake"))
    assert_clean_error(out, str(a_file / "lake"), "Not a directory", "check that path")


def test_report_out_on_an_existing_file_is_an_error_naming_it(small_lake, tmp_path):
    a_file = tmp_path / "report.html"
    a_file.write_text("")
    out = datahub("report", "--lake", str(small_lake), "--out", str(a_file))
    assert_clean_error(out, str(a_file), "File exists")


@pytest.mark.parametrize("command", [["qa", "--no-record"], ["report", "--out", "REPORT"]])
def test_a_table_version_past_the_latest_is_an_error_naming_the_latest(small_lake, tmp_path, command):
    command = [str(tmp_path / "report") if arg == "REPORT" else arg for arg in command]
    out = datahub(*command, "--lake", str(small_lake), "--version", "7")
    assert_clean_error(out, "no version 7 of table 'samples'; its latest is 1")
    negative = datahub(*command, "--lake", str(small_lake), "--version", "-1")
    assert_clean_error(negative, "no version -1 of table 'samples'")


def test_lineage_of_a_source_given_as_a_relative_path_finds_its_records(small_lake):
    """The job lists local inputs as absolute paths; the user types the path they gave the job."""
    root = small_lake.parent
    relative = datahub("lineage", "--source", "a.jsonl", "--lake", str(small_lake), "--json", cwd=root)
    assert relative.returncode == 0, relative.stderr
    story = json.loads(relative.stdout)
    assert story["source_uri"] == str(root / "a.jsonl") and len(story["records"]) == 3
    as_url = datahub("lineage", "--source", f"file://{root / 'a.jsonl'}", "--lake", str(small_lake), "--json")
    assert as_url.returncode == 0 and json.loads(as_url.stdout) == story
    missing = datahub("lineage", "--source", "b.jsonl", "--lake", str(small_lake), cwd=root)
    assert missing.returncode == 1 and "no record of b.jsonl" in missing.stderr


@pytest.mark.parametrize("command", [["runs"], ["quarantine"], ["release", "list"], ["inspect"], ["evalset", "list"]])
def test_a_typo_in_the_lake_path_is_an_error_not_an_empty_lake(small_lake, command):
    """Before, `datahub runs --lake lake/dmeo` said 'no runs recorded' with exit 0 (and `tier plan` 'nothing to move')."""
    typo = small_lake.parent / "lkae"
    out = datahub(*command, "--lake", str(typo))
    assert_clean_error(out, f"--lake {typo}: no lake at {typo} (no such directory)")
    assert datahub(*command, "--lake", str(small_lake)).returncode == 0


def test_a_typo_in_the_lake_path_makes_tier_plan_fail(small_lake, tmp_path):
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    out = datahub("tier", "plan", "--lake", str(small_lake.parent / "lkae"), "--storage", str(storage))
    assert_clean_error(out, "no lake at")
    assert "nothing to move" in datahub("tier", "plan", "--lake", str(small_lake), "--storage", str(storage)).stdout


def test_a_merge_threshold_out_of_range_is_refused_as_a_bad_option_value(small_lake):
    out = datahub("release", "merge", "m", "--from", "a", "--from", "b", "--dedup", "near", "--threshold", "2",
                  "--lake", str(small_lake))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "Invalid value for --threshold: must be in (0, 1], got 2.0" in out.stderr, out.stderr
    assert "validation error" not in out.stderr and "pydantic" not in out.stderr


def test_file_tokens_zero_is_refused_not_taken_as_the_default(small_lake, tmp_path):
    from tests.export.test_tokens import train_tokenizer

    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    out = datahub("export", "t0", "--lake", str(small_lake), "--tier", "cfs", "--storage", str(storage), "--table", "samples",
                  "--tokenizer", str(train_tokenizer(tmp_path / "tok.json")), "--file-tokens", "0")
    assert_clean_error(out, "--file-tokens must be >= 1, got 0")
    assert not (tmp_path / "cfs").exists()


def test_run_takes_a_lake_yaml_as_every_other_command_does(tmp_path):
    """README: every command takes --lake ROOT_OR_YAML. Before, `datahub run JOB --lake lake.yaml` made lake.root the
    YAML's own path (its first write failed with 'lake.yaml/_leases: Not a directory')."""
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'from-yaml'}\nstorage_options: {{AWS_REGION: us-east-1}}\n")
    out = datahub("run", "jobs/demo.yaml", "--lake", str(lake_file), "--check", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["lake"] == str(tmp_path / "from-yaml")
    root = datahub("run", "jobs/demo.yaml", "--lake", str(tmp_path / "plain"), "--check")
    assert root.returncode == 0 and f"lake {tmp_path / 'plain'}," in root.stdout


def test_run_refuses_set_lake_fields_with_a_lake_yaml(tmp_path):
    """The lake YAML replaces the spec's lake section, so a --set lake.* beside it was dropped without a word."""
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'from-yaml'}\n")
    out = datahub("run", "jobs/demo.yaml", "--lake", str(lake_file), "--set", f"lake.root={tmp_path / 'other'}",
                  "--check")
    assert out.returncode == 2, out.stdout
    assert f"--set lake.root={tmp_path / 'other'} and --lake {lake_file} both set the lake" in out.stderr, out.stderr
    kept = datahub("run", "jobs/demo.yaml", "--lake", str(tmp_path / "plain"), "--set",
                   f"lake.root={tmp_path / 'other'}", "--check")
    assert kept.returncode == 0, kept.stderr


def test_the_resume_hint_of_a_run_on_a_lake_yaml_names_the_yaml(tmp_path):
    """A failed run's hint is pasted as is: `--lake LAKE.yaml` keeps the lake's storage options, its root would not."""
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'lake'}\n")
    failed = subprocess.run([sys.executable, "-m", "datahub.cli.main", "run", "jobs/demo.yaml", "--engine", "spark",
                             "--lake", str(lake_file)], cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java")})  # fails fast: no Java there
    assert failed.returncode == 2 and "needs Java" in failed.stderr, failed.stderr
    runs = datahub("runs", "--lake", str(lake_file))
    assert runs.returncode == 0, runs.stderr
    assert f"datahub run {REPO / 'jobs/demo.yaml'} --lake {lake_file}" in runs.stdout, runs.stdout


def test_quarantine_of_a_mistyped_run_id_names_the_runs_that_quarantined(tmp_path):
    """`datahub quarantine --run RUN` with a run id one character off said "nothing quarantined" (as for a run
    that quarantined nothing), so the user believed the run was clean; now the line names the runs that did."""
    from tests.cli.conftest import make_small_lake

    lake = make_small_lake(tmp_path)  # a.jsonl has no bad record: add a run that quarantines one
    (tmp_path / "b.jsonl").write_text('{"text": "a fine record about rivers"}\n{not json\n')
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    spec = validate_job_spec({"name": "small", "lake": {"root": str(lake)},
                              "inputs": [{"uri": str(tmp_path / "*.jsonl")}], "graph": {"samples": {"sink": "samples"}}})
    run_id = run_job(spec, engine=ArrowEngine()).run_id
    right = datahub("quarantine", "--lake", str(lake), "--run", run_id, "--examples", "0")
    assert right.returncode == 0 and "invalid_json" in right.stdout, right.stdout + right.stderr
    # the examples show the record's first bytes (stored in the table; before, only the parser's message was shown)
    shown = datahub("quarantine", "--lake", str(lake), "--run", run_id)
    assert f"{tmp_path / 'b.jsonl'}:2" in shown.stdout and "record (9 bytes): {not json" in shown.stdout, shown.stdout
    (example,) = json.loads(datahub("quarantine", "--lake", str(lake), "--json").stdout)["reasons"][0]["examples"]
    assert example["raw_preview"] == "{not json" and example["raw_size"] == 9
    typo = datahub("quarantine", "--lake", str(lake), "--run", run_id[:-1] + "x")
    assert typo.returncode == 0, typo.stderr
    assert f"by run {run_id[:-1] + 'x'!r}" in typo.stdout and f"did you mean {run_id!r}?" in typo.stdout, typo.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small lake whose release r1 is exported to tier cfs (of two), and the storage YAML."""
    from datahub.export import export_release
    from datahub.lake import Lake
    from datahub.release import create_release
    from datahub.storage import load_storage_config
    from tests.cli.conftest import make_small_lake

    root = tmp_path_factory.mktemp("exported")
    lake = make_small_lake(root)
    storage = root / "storage.yaml"
    storage.write_text("tiers:\n" + "".join(f"  {t}:\n    kind: cfs\n    path: {root / t}\n" for t in ("cfs", "cfs2")))
    create_release(Lake(str(lake)), "r1")
    export_release(Lake(str(lake)), "r1", tier="cfs", storage=load_storage_config(storage), shard_samples=2)
    return lake, storage


@pytest.mark.parametrize("tiers", ["", ",", " , "])
def test_tiers_that_name_no_tier_are_refused_not_read_as_the_policy(exported, tiers):
    """`tier apply --release R --tiers "$TIERS"` with the variable unset applied the storage policy to R (and ","
    planned nothing), exit 0, instead of the placement the script meant to give."""
    lake, storage = exported
    for command in ("plan", "apply"):
        out = datahub("tier", command, "--lake", str(lake), "--storage", str(storage), "--release", "r1",
                      "--tiers", tiers)
        assert_clean_error(out, f"--tiers {tiers!r} names no tier", "e.g. --tiers cfs,cfs2", "drop --tiers")
    assert [p.name for p in sorted((lake.parent / "cfs").rglob("*.tar"))] == ["r1-000000.tar", "r1-000001.tar"]


@pytest.mark.parametrize("command", [["runs"], ["quarantine"], ["tier", "plan", "--storage", "STORAGE"], ["inspect"]])
def test_a_directory_above_the_lake_is_an_error_naming_the_lakes_in_it(small_lake, tmp_path, command):
    """`datahub runs --lake lake` after `make demo` (the lake is ./lake/demo) said "no runs recorded", exit 0, as
    for a lake with no runs; any directory without a Delta table read as an empty lake."""
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    command = [str(storage) if arg == "STORAGE" else arg for arg in command]
    above = small_lake.parent  # holds the lake `lake` and its input a.jsonl
    out = datahub(*command, "--lake", str(above))
    assert_clean_error(out, f"no lake at {above} (no Delta table in it); the lakes under it: lake: "
                            f"e.g. --lake {above}/lake")
    table = datahub(*command, "--lake", str(small_lake / "samples"))
    assert_clean_error(table, f"it is the Delta table 'samples' of a lake: e.g. --lake {small_lake}")
    other = tmp_path / "other"  # a directory of something else: not a lake
    other.mkdir()
    (other / "notes.txt").write_text("not a lake\n")
    assert_clean_error(datahub(*command, "--lake", str(other)), f"no lake at {other} (no Delta table in it); check "
                                                                 "the path")
    (other / "_leases").mkdir()  # a run killed before its first commit leaves only its lease: a lake (lead, 20:03)
    assert "no lake at" not in datahub(*command, "--lake", str(other)).stderr
    empty = tmp_path / "empty"  # a lake-to-be (made by hand or a deploy) reads as an empty lake, as before
    empty.mkdir()
    assert "no lake at" not in datahub(*command, "--lake", str(empty)).stderr
    (empty / "lost+found").mkdir()  # a fresh mount, a kept directory: still a lake-to-be (reviewer-ux39 #2)
    (empty / ".gitkeep").write_text("")
    assert "no lake at" not in datahub(*command, "--lake", str(empty)).stderr
    above_fresh = tmp_path / "fresh"  # a directory of empty directories names none of them as a lake
    (above_fresh / "lost+found").mkdir(parents=True)
    (above_fresh / "notes").mkdir()
    (above_fresh / "notes" / "a.txt").write_text("x\n")
    assert_clean_error(datahub(*command, "--lake", str(above_fresh)), f"no lake at {above_fresh} (no Delta table in "
                                                                      "it); check the path")


def test_tier_apply_to_a_ceph_tier_nothing_answers_on_is_one_line_naming_it(exported, tmp_path, monkeypatch):
    """A copy to a tier whose RGW is down ended in a 188-line botocore/aiohttp traceback, exit 1."""
    lake, _ = exported
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {lake.parent / 'cfs'}\n"
                       "  ceph:\n    kind: ceph\n    endpoint_url: http://127.0.0.1:9\n    bucket: datahub\n"
                       "    credentials: {key_env: UXA_KEY, secret_env: UXA_SECRET}\n")
    monkeypatch.setenv("UXA_KEY", "key")
    monkeypatch.setenv("UXA_SECRET", "secret")
    out = datahub("tier", "apply", "--lake", str(lake), "--storage", str(storage), "--release", "r1",
                  "--tiers", "cfs,ceph")
    assert_clean_error(out, f"{storage}: tiers.ceph.endpoint_url http://127.0.0.1:9: nothing answers (")


def test_the_tier_check_leaves_a_tier_reached_through_a_proxy_to_the_client():
    """boto and WebHDFS (requests) honour HTTP(S)_PROXY; a direct TCP connect to a host only the proxy reaches
    refused a working tier ("host not found", exit 2; reviewer-ux39 #1). NO_PROXY hosts are still checked."""
    from types import SimpleNamespace

    from datahub.cli.arguments import tier_answers
    from datahub.errors import StorageError

    config = SimpleNamespace(source="storage.yaml", tiers={"ceph": SimpleNamespace(
        kind="ceph", endpoint_url="http://rgw.invalid:7480")})
    proxied = {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": ""}
    direct = {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "rgw.invalid"}
    saved = {k: os.environ.get(k) for k in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY",
                                             "all_proxy")}
    try:
        for key in saved:
            os.environ.pop(key, None)
        os.environ.update(proxied)
        tier_answers(config, "ceph")  # the proxy's business: no refusal here
        os.environ.update(direct)
        with pytest.raises(StorageError, match="rgw.invalid"):
            tier_answers(config, "ceph")
        os.environ.pop("HTTP_PROXY")
        os.environ.pop("NO_PROXY")
        with pytest.raises(StorageError, match="nothing answers"):
            tier_answers(config, "ceph")
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def test_errors_stay_one_line_on_a_click_without_no_args_is_help_error(tmp_path):
    """click < 8.2 (typer >= 0.12 allows it) has no NoArgsIsHelpError: naming it in an `except` turned every error
    into an AttributeError traceback (reviewer-ux39 #3)."""
    script = (
        "import sys\n"
        "try:\n    from typer._click import exceptions as e\nexcept ImportError:\n    from click import exceptions as e\n"
        "del e.NoArgsIsHelpError\n"
        "from datahub.cli.main import _run\n"
        f"sys.argv = ['datahub', 'runs', '--lake', {str(tmp_path / 'missing' / 'lake')!r}]\n"
        "sys.exit(_run())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "error:" in out.stderr

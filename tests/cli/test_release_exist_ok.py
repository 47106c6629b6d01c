"""`datahub release create NAME --exist-ok`: a retried pipeline (run -> release create -> export, re-run by Airflow
or cron after a later step failed) failed at create ("release 'X' already exists ...", exit 2), so scripts added
`|| true` and hid real refusals. With --exist-ok the same release (same table, same version) is a no-op, exit 0;
a release of that name freezing another version is still refused, naming both versions."""

from __future__ import annotations

import json

from datahub.lake import Lake
from tests.cli.conftest import datahub


def test_exist_ok_accepts_the_same_release_and_refuses_another_version(small_lake):
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    lake = str(small_lake)
    assert datahub("release", "create", "nightly", "--lake", lake).returncode == 0
    again = datahub("release", "create", "nightly", "--lake", lake)
    assert again.returncode == 2 and "already exists" in again.stderr  # without the flag: as before

    same = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok")
    assert same.returncode == 0, same.stderr
    assert "release nightly already exists (samples v1): nothing to do" in " ".join(same.stdout.split()), same.stdout
    as_json = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok", "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert shown["name"] == "nightly" and shown["version"] == 1 and shown["existed"] is True

    (small_lake.parent / "b.jsonl").write_text(json.dumps({"text": "a second delivery about the harbour"}) + "\n")
    spec = validate_job_spec({"name": "small", "lake": {"root": lake}, "inputs": [{"uri": str(small_lake.parent / "*.jsonl")}],
                              "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"  # samples v2
    newer = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok")
    assert newer.returncode == 2, newer.stdout
    assert ("release 'nightly' already exists and froze samples v1, not samples v2 as asked" in newer.stderr
            and "choose a new name" in newer.stderr), newer.stderr
    pinned = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok", "--version", "1")
    assert pinned.returncode == 0, pinned.stderr

    fresh = datahub("release", "create", "nightly-2", "--lake", lake, "--exist-ok", "--json")
    assert fresh.returncode == 0 and json.loads(fresh.stdout)["existed"] is False, fresh.stderr

    from datahub.release import merge_releases

    merge_releases(Lake(lake), "mix", sources=["nightly"])  # a merge of that name: no --version can match it
    merged = datahub("release", "create", "mix", "--lake", lake, "--exist-ok")
    assert merged.returncode == 2 and "already exists as a merge release, not a create of samples v2" in merged.stderr
    assert "--version" not in merged.stderr, merged.stderr


def test_exist_ok_does_not_accept_a_release_made_without_what_is_asked_now(tmp_path):
    """Review finding: --exist-ok compared only the table version, so a retried `release create nightly --require-qa
    --exist-ok` accepted a release created without QA results (exit 0), and a release created with
    --allow-contamination was accepted by a retry without it; a missing --table said "not samples vNone as asked"."""
    from tests.cli.conftest import make_small_lake

    lake = str(make_small_lake(tmp_path))
    assert datahub("release", "create", "nightly", "--lake", lake).returncode == 0  # no QA results
    qa = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok", "--require-qa")
    assert qa.returncode == 2, qa.stdout
    assert ("release 'nightly' already exists but was created without QA results; --require-qa cannot be satisfied "
            "by it: choose a new name") in qa.stderr, qa.stderr
    missing = datahub("release", "create", "nightly", "--lake", lake, "--exist-ok", "--table", "sampels")
    assert missing.returncode == 2 and "no table 'sampels' to release" in missing.stderr, missing.stderr
    assert "vNone" not in missing.stderr


def test_exist_ok_does_not_accept_a_contaminated_release_without_the_same_allowance(tmp_path):
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    leaked = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge the boxing match tonight"
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": leaked}) + "\n")
    spec = validate_job_spec({"name": "c", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(tmp_path / "a.jsonl")}], "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = str(tmp_path / "lake")
    (tmp_path / "bench.jsonl").write_text(json.dumps({"question": "what happened?", "answer": leaked}) + "\n")
    assert datahub("evalset", "add", "bench", str(tmp_path / "bench.jsonl"), "--lake", lake).returncode == 0
    assert datahub("release", "create", "r", "--lake", lake, "--allow-contamination", "held-out split").returncode == 0
    retry = datahub("release", "create", "r", "--lake", lake, "--exist-ok")
    assert retry.returncode == 2, retry.stdout
    assert "already exists and was created with --allow-contamination 'held-out split'" in retry.stderr, retry.stderr
    same = datahub("release", "create", "r", "--lake", lake, "--exist-ok", "--allow-contamination", "held-out split")
    assert same.returncode == 0, same.stderr

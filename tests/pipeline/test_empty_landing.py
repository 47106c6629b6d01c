"""A scheduled job over a landing directory that upstream empties after each run (files moved away once
ingested): before, every run that found the directory empty failed ("inputs.0.uri: ... matches no file", exit 2),
so cron mailed an error and Airflow retried a run that had nothing to do. Settled (session 37b): once the job has a
succeeded run in the lake, an input that matches no file in a directory that exists is a no-op run (exit 0, a line
saying which input matched nothing, a parseable --json result); a first run, or a local directory that does not
exist (a typo, an unmounted path), stays an error."""

from __future__ import annotations

import json

from datahub.lake import Lake
from tests.cli.conftest import datahub


def _job(tmp_path, uri: str) -> str:
    job = tmp_path / "landing.yaml"
    job.write_text(f"name: landing\nengine: {{kind: spark}}\nlake: {{root: {tmp_path / 'lake'}}}\n"
                   f"inputs:\n  - uri: {uri}\ngraph:\n  samples: {{sink: samples}}\n")
    return str(job)


def test_an_empty_landing_directory_after_a_run_is_a_no_op(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    job = _job(tmp_path, f"{landing}/*.jsonl")

    first = datahub("run", job, "--json")  # nothing ever landed: an error, as before
    assert first.returncode == 2 and "inputs.0.uri" in first.stderr and "matches no file" in first.stderr, first.stderr

    (landing / "a.jsonl").write_text(json.dumps({"text": "the first delivery of the landing directory"}) + "\n")
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    spec = validate_job_spec({"name": "landing", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": f"{landing}/*.jsonl"}], "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    (landing / "a.jsonl").unlink()  # upstream moves ingested files away

    text = datahub("run", job)
    assert text.returncode == 0, text.stderr
    assert f"nothing to do (no new input files; inputs.0.uri '{landing}/*.jsonl' matches no file now)" in text.stdout, \
        text.stdout
    as_json = datahub("run", job, "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["status"] == "skipped" and result["inputs"] == []
    assert result["notes"] == [f"inputs.0.uri '{landing}/*.jsonl' matches no file now"]
    check = datahub("run", job, "--check", "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["inputs"] == [], check.stderr
    assert Lake(tmp_path / "lake").read("samples").num_rows == 1  # nothing written by the no-op runs

    landing.rmdir()  # the directory itself gone (unmounted, renamed): an error even after runs
    gone = datahub("run", job)
    assert gone.returncode == 2, gone.stdout
    assert f"inputs.0.uri: '{landing}/*.jsonl' matches no file and its directory {landing} does not exist" in gone.stderr


def test_a_full_run_with_an_emptied_input_is_refused_not_a_deletion(tmp_path):
    """Review finding on the no-op above: `--full` replaces the job's rows with those of the files listed now, so
    with one input emptied it committed the other input's rows only and the emptied input's samples were deleted
    (8 samples -> 3, status succeeded). A --full run with an input that matches nothing stays an error saying why."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.errors import SpecError
    from datahub.pipeline.run import run_job

    landing, archive = tmp_path / "landing", tmp_path / "archive"
    landing.mkdir()
    archive.mkdir()
    (landing / "a.jsonl").write_text("".join(json.dumps({"text": f"landing document {i} about the harbour"}) + "\n"
                                             for i in range(5)))
    (archive / "b.jsonl").write_text("".join(json.dumps({"text": f"archive document {i} about the valley"}) + "\n"
                                             for i in range(3)))
    spec = validate_job_spec({"name": "two", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": f"{landing}/*.jsonl"}, {"uri": f"{archive}/*.jsonl"}],
                              "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    (landing / "a.jsonl").unlink()
    try:
        run_job(spec, engine=ArrowEngine(), full=True)
        raise AssertionError("a --full run with an emptied input was not refused")
    except SpecError as exc:
        assert (f"inputs.0.uri '{landing}/*.jsonl' matches no file; --full replaces the job's rows with those of the "
                "files listed now, so the samples of that input's earlier files would be deleted") in str(exc), exc
    assert Lake(tmp_path / "lake").read("samples").num_rows == 8
    assert run_job(spec, engine=ArrowEngine()).status == "skipped"  # incremental: the no-op, as above


def test_an_input_no_earlier_run_read_from_stays_an_error(tmp_path):
    """Review finding: the no-op was allowed for any input of a job with a succeeded run, so a typo made in the spec
    after the first run passed as "nothing to do" for ever when its parent directory existed (a directory input
    `/data/landng` looks at /data) or on an object store. Now an input may match nothing only if an earlier run of
    the job read a file it matches."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.errors import SpecError
    from datahub.pipeline.run import run_job

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text(json.dumps({"text": "the first delivery of the landing directory"}) + "\n")

    def spec(uri: str):
        return validate_job_spec({"name": "landing", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": uri}],
                                  "graph": {"samples": {"sink": "samples"}}})

    assert run_job(spec(str(landing)), engine=ArrowEngine()).status == "succeeded"  # a directory input
    (landing / "a.jsonl").unlink()
    assert run_job(spec(str(landing)), engine=ArrowEngine()).status == "skipped"
    assert run_job(spec(f"{landing}/*.jsonl"), engine=ArrowEngine()).status == "skipped"  # the same files by glob
    (tmp_path / "elsewhere").mkdir()
    for typo in (str(tmp_path / "landng"), f"{tmp_path / 'elsewhere'}/*.jsonl"):
        try:
            run_job(spec(typo), engine=ArrowEngine())
            raise AssertionError(f"{typo}: an input no earlier run read from passed as a no-op")
        except SpecError as exc:
            assert (f"inputs.0.uri: {typo!r} matches no file, and no earlier run of job 'landing' read a file from "
                    "it; check the path or glob") in str(exc), exc


def test_check_does_not_read_the_lake_when_every_input_matches(tmp_path):
    """Review finding on 22ee5b5: `run --check` read the lake's runs table to decide about empty inputs, so checking a
    production spec in CI or on a laptop (lake unreachable) retried for ~70 s and failed. The runs are read only when
    an input matched nothing."""
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "a record"}) + "\n")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: prod\nlake:\n  root: s3://nobucket/lake\n  storage_options: {{AWS_ENDPOINT_URL: "
                   f"'http://127.0.0.1:9', AWS_ALLOW_HTTP: 'true', AWS_ACCESS_KEY_ID: k, AWS_SECRET_ACCESS_KEY: s}}\n"
                   f"inputs:\n  - uri: {tmp_path}/*.jsonl\ngraph:\n  samples: {{sink: samples}}\n")
    out = datahub("run", str(job), "--check", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["inputs"] == [str(tmp_path / "a.jsonl")]


def test_a_partitioned_landing_glob_with_several_stars_is_a_no_op_when_emptied(tmp_path):
    """Review finding on 07950c8: Python's fnmatch.translate gives an atomic group for every '*' but the last, which
    Arrow's RE2 refuses, so `landing/*/*.jsonl` (date partitions) died with an ArrowInvalid traceback once emptied."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    day = tmp_path / "landing" / "2026-12-07"
    day.mkdir(parents=True)
    (day / "part-[1].jsonl").write_text(json.dumps({"text": "a delivery in a date partition"}) + "\n")
    for uri in (f"{tmp_path}/landing/*/*.jsonl", f"{tmp_path}/landing/*/part-?1?.json*", f"{tmp_path}/*/2026-*/[p]*"):
        spec = validate_job_spec({"name": "parts", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": uri}],
                                  "graph": {"samples": {"sink": "samples"}}})
        if not (tmp_path / "lake").exists():
            assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
            (day / "part-[1].jsonl").unlink()
        assert run_job(spec, engine=ArrowEngine()).status == "skipped", uri

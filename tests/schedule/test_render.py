"""`datahub schedule render`: CronJob manifests parse with the right structure; Airflow DAGs compile and run."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest
import yaml

from datahub.errors import SpecError
from datahub.schedule.render import render_jobs
from tests.pipeline.corpus import job_raw, make_corpus, run_cli, write_job


@pytest.fixture
def jobs(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=2)
    nightly = write_job(tmp_path / "nightly.yaml", {**job_raw(corpus, "s3://lake/prod", name="Nightly_Web"), "schedule": "0 3 * * *"})
    hourly = write_job(tmp_path / "hourly.yaml", {**job_raw(corpus, "/data/lake", name="hourly-code"), "schedule": "@hourly"})
    return nightly, hourly


def test_k8s_cronjob_manifests(jobs, tmp_path):
    out = tmp_path / "k8s"
    result = run_cli(["schedule", "render", "--target", "k8s-cronjob", *map(str, jobs), "--out", str(out),
                      "--image", "registry.local/datahub:1.2", "--json"])
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)
    assert [w["job"] for w in written] == ["Nightly_Web", "hourly-code"]
    docs = list(yaml.safe_load_all((out / "datahub-nightly-web.yaml").read_text()))
    config_map, cron = docs
    assert config_map["kind"] == "ConfigMap" and yaml.safe_load(config_map["data"]["nightly.yaml"])["name"] == "Nightly_Web"
    assert cron["apiVersion"] == "batch/v1" and cron["kind"] == "CronJob"
    assert cron["metadata"]["name"] == "datahub-nightly-web"
    spec = cron["spec"]
    assert spec["schedule"] == "0 3 * * *" and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    (container,) = pod["containers"]
    assert container["image"] == "registry.local/datahub:1.2"
    assert container["command"] == ["datahub"] and container["args"] == ["run", "/etc/datahub/jobs/nightly.yaml"]
    mount = container["volumeMounts"][0]
    assert mount["mountPath"] == "/etc/datahub/jobs"
    assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    hourly = list(yaml.safe_load_all((out / "datahub-hourly-code.yaml").read_text()))[1]
    assert hourly["spec"]["schedule"] == "@hourly"


FAKE_AIRFLOW = {
    "airflow/__init__.py": """
        CREATED = []
        class DAG:
            def __init__(self, **kwargs):
                self.kwargs, self.tasks = kwargs, []
                CREATED.append(self)
            def __enter__(self):
                global CURRENT
                CURRENT = self
                return self
            def __exit__(self, *exc):
                pass
    """,
    "airflow/operators/__init__.py": "",
    "airflow/operators/bash.py": """
        import airflow
        class BashOperator:
            def __init__(self, *, task_id, bash_command):
                self.task_id, self.bash_command = task_id, bash_command
                airflow.CURRENT.tasks.append(self)
    """,
}


def test_airflow_dag_compiles_and_runs_against_airflow_api_shape(jobs, tmp_path):
    out = tmp_path / "dags"
    written = render_jobs(list(jobs), target="airflow", out=out, jobs_dir="/opt/airflow/jobs", lake="s3://lake/x y")
    dag_file = written[0].path
    source = dag_file.read_text()
    tree = ast.parse(source)  # valid Python
    compile(source, str(dag_file), "exec")
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"DAG", "BashOperator"} <= set(calls)
    kwargs = {k.arg: k.value for k in calls["DAG"].keywords}
    assert ast.literal_eval(kwargs["max_active_runs"]) == 1 and ast.literal_eval(kwargs["schedule"]) == "0 3 * * *"
    assert kwargs["catchup"].value is False
    # Airflow itself is too big to install here: run the file against a stand-in with Airflow's API shape.
    for name, text in FAKE_AIRFLOW.items():
        path = tmp_path / "fake" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    probe = (
        "import runpy, json, airflow\n"
        f"runpy.run_path({str(dag_file)!r})\n"
        "(dag,) = airflow.CREATED\n"
        "print(json.dumps({'dag_id': dag.kwargs['dag_id'], 'schedule': dag.kwargs['schedule'],"
        " 'tasks': [[t.task_id, t.bash_command] for t in dag.tasks]}))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path / "fake", check=False)
    assert run.returncode == 0, run.stderr
    dag = json.loads(run.stdout)
    assert dag["dag_id"] == "datahub_Nightly_Web" and dag["schedule"] == "0 3 * * *"
    ((task_id, command),) = dag["tasks"]
    assert shlex.split(command) == ["datahub", "run", "/opt/airflow/jobs/nightly.yaml", "--lake", "s3://lake/x y"]


def test_job_without_schedule_is_refused(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    job = write_job(tmp_path / "plain.yaml", job_raw(corpus, tmp_path / "lake"))
    with pytest.raises(SpecError, match=r"plain.yaml: schedule: missing"):
        render_jobs([job], target="airflow", out=tmp_path / "out")
    result = run_cli(["schedule", "render", "--target", "cron-tab", str(job), "--out", str(tmp_path / "o")])
    assert result.returncode == 2 and "choose one of k8s-cronjob, airflow" in result.stderr


def test_relative_lake_or_inputs_are_refused_before_rendering(tmp_path):
    """A scheduled run's working directory is the scheduler's (an Airflow task's temporary directory, the pod's
    WORKDIR): a relative lake.root would be written there and lost, relative inputs would match nothing."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    relative_lake = write_job(tmp_path / "rel-lake.yaml", {**job_raw(corpus, "./lake/demo"), "schedule": "@daily"})
    for target in ("airflow", "k8s-cronjob"):
        with pytest.raises(SpecError, match=r"rel-lake.yaml: lake.root: './lake/demo' is a relative path.*or pass --lake"):
            render_jobs([relative_lake], target=target, out=tmp_path / "out")
    assert render_jobs([relative_lake], target="airflow", out=tmp_path / "out", lake="/data/lake")
    with pytest.raises(SpecError, match=r"--lake: 'lake' is a relative path"):
        render_jobs([relative_lake], target="airflow", out=tmp_path / "out", lake="lake")
    raw = {**job_raw(corpus, "s3://lake/prod"), "schedule": "@daily"}
    raw["inputs"] = [{**raw["inputs"][0], "uri": "data/demo/*.jsonl.*"}]
    relative_inputs = write_job(tmp_path / "rel-inputs.yaml", raw)
    result = run_cli(["schedule", "render", "--target", "airflow", str(relative_inputs), "--out", str(tmp_path / "o")])
    assert result.returncode == 2 and "inputs.0.uri: 'data/demo/*.jsonl.*' is a relative path" in result.stderr


def test_two_jobs_with_one_name_are_refused_before_anything_is_written(tmp_path):
    """Both would render to one file (one CronJob, one DAG id): the second replaced the first without a word."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    first = write_job(tmp_path / "web.yaml", {**job_raw(corpus, "/data/lake-us", name="web"), "schedule": "@daily"})
    second = write_job(tmp_path / "web-eu.yaml", {**job_raw(corpus, "/data/lake-eu", name="web"), "schedule": "@daily"})
    for target in ("airflow", "k8s-cronjob"):
        out = tmp_path / target
        with pytest.raises(SpecError, match=r"web-eu.yaml: name: job 'web' renders to .*, as job 'web' of .*web.yaml "
                                            r"does; give each scheduled job its own name"):
            render_jobs([first, second], target=target, out=out)
        assert list(out.iterdir()) == []
    assert len(render_jobs([first], target="airflow", out=tmp_path / "one")) == 1


def test_cron_target_writes_a_crontab_line_that_runs_from_crons_bare_environment(jobs, tmp_path):
    """README: scheduled runs come "from cron, a Kubernetes CronJob or Airflow", but `--target cron` was refused
    ('choose one of k8s-cronjob, airflow') and a hand-written line met cron's PATH (/usr/bin:/bin, no venv) and
    working directory (the home directory). The rendered line names the executable and the job by absolute path
    and holds a lock so a slow run is not started twice (as concurrencyPolicy Forbid / max_active_runs=1 do)."""
    out = tmp_path / "cron"
    result = run_cli(["schedule", "render", "--target", "cron", *map(str, jobs), "--out", str(out), "--lake",
                      str(tmp_path / "lake"), "--json"])
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout)
    assert [(w["job"], w["target"]) for w in written] == [("Nightly_Web", "cron"), ("hourly-code", "cron")]
    text = (out / "datahub-nightly-web.cron").read_text()
    entries = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(entries) == 1 and "crontab" in text  # the header says how to install it
    fields = entries[0].split(None, 5)
    assert fields[:5] == ["0", "3", "*", "*", "*"]
    command = shlex.split(fields[5])
    assert command[:3] == ["flock", "-n", command[2]] and command[2].startswith("/")
    executable, *args = command[3:]
    assert os.path.isabs(executable) and os.access(executable, os.X_OK), executable
    assert args == ["run", str(jobs[0].resolve()), "--lake", str(tmp_path / "lake")]
    hourly = [line for line in (out / "datahub-hourly-code.cron").read_text().splitlines() if line.startswith("@hourly ")]
    assert len(hourly) == 1
    # the command as cron runs it: from / with cron's PATH; --check validates the spec and lists the inputs
    bare = subprocess.run(["/bin/sh", "-c", fields[5] + " --check --json"], cwd="/", capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"})
    assert bare.returncode == 0, bare.stderr
    assert json.loads(bare.stdout)["lake"] == str(tmp_path / "lake")


def test_relative_inputs_for_a_cronjob_name_the_images_workdir(tmp_path):
    """Settled: relative inputs stay refused for k8s CronJobs. The pod resolves them against its image's WORKDIR,
    not the checkout you render from, where they look right; data baked into the image has an absolute path there.
    The message says so and gives that path (before, it only said 'the scheduler's working directory')."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    raw = {**job_raw(corpus, "s3://lake/prod"), "schedule": "@daily"}
    raw["inputs"] = [{**raw["inputs"][0], "uri": "data/demo/*.jsonl.*"}]
    job = write_job(tmp_path / "rel-inputs.yaml", raw)
    with pytest.raises(SpecError, match=r"inputs.0.uri: 'data/demo/\*.jsonl.\*' is a relative path.*image's WORKDIR "
                                        r"\(/opt/datahub in docker/Dockerfile\).*'/opt/datahub/data/demo/\*.jsonl.\*'"):
        render_jobs([job], target="k8s-cronjob", out=tmp_path / "out")
    with pytest.raises(SpecError, match=r"relative path.*cron starts the job in the crontab owner's home directory"):
        render_jobs([job], target="cron", out=tmp_path / "out")


def test_a_lake_yaml_given_as_lake_travels_with_the_cronjob(jobs, tmp_path):
    """`--lake LAKE.yaml` (an S3 lake with its storage options, as every command takes it) rendered into the pod's
    args as the path on the rendering machine: in the pod no such file exists, so `datahub run` took the path for a
    lake root and wrote a lake into the container's filesystem, lost when the pod ended, every night. Now the YAML
    goes into the ConfigMap beside the job spec and --lake names its mount; its ${VARS} stay for the pod's env (the
    datahub-storage Secret), and a literal credential in it is refused (it would sit in a ConfigMap)."""
    lake_file = tmp_path / "prod-lake.yaml"
    lake_file.write_text("root: s3://lake/prod\nstorage_options:\n  AWS_ENDPOINT_URL: http://rgw:7480\n"
                         "  AWS_ACCESS_KEY_ID: ${KEY}\n  AWS_SECRET_ACCESS_KEY: ${SECRET}\n")
    out = tmp_path / "k8s"
    result = run_cli(["schedule", "render", "--target", "k8s-cronjob", str(jobs[0]), "--out", str(out),
                      "--lake", str(lake_file)])
    assert result.returncode == 0, result.stderr
    config_map, cron = yaml.safe_load_all((out / "datahub-nightly-web.yaml").read_text())
    assert config_map["data"]["prod-lake.yaml"] == lake_file.read_text()
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["run", "/etc/datahub/jobs/nightly.yaml", "--lake", "/etc/datahub/jobs/prod-lake.yaml"]

    here = os.getcwd()
    try:  # a relative path to the lake YAML is fine: it is read here (k8s: into the ConfigMap; cron: made absolute)
        os.chdir(tmp_path)
        assert render_jobs([jobs[0]], target="k8s-cronjob", out=tmp_path / "k8s-rel", lake="prod-lake.yaml")
        (cron_file,) = render_jobs([jobs[0]], target="cron", out=tmp_path / "cron-rel", lake="prod-lake.yaml")
        assert f"--lake {lake_file}" in cron_file.path.read_text()
    finally:
        os.chdir(here)

    relative_root = tmp_path / "rel-lake.yaml"
    relative_root.write_text("root: lake/prod\n")
    refused = run_cli(["schedule", "render", "--target", "k8s-cronjob", str(jobs[0]), "--out", str(out),
                       "--lake", str(relative_root)])
    assert refused.returncode == 2 and f"{relative_root}: root: 'lake/prod' is a relative path" in refused.stderr, \
        refused.stderr
    literal = tmp_path / "literal.yaml"
    literal.write_text("root: s3://lake/prod\nstorage_options:\n  AWS_SECRET_ACCESS_KEY: hunter2\n")
    leaked = run_cli(["schedule", "render", "--target", "k8s-cronjob", str(jobs[0]), "--out", str(out),
                      "--lake", str(literal)])
    assert leaked.returncode == 2 and "hunter2" not in leaked.stderr, leaked.stderr
    assert (f"{literal}: storage_options.AWS_SECRET_ACCESS_KEY: a literal credential would be written into the "
            "ConfigMap; put it in the datahub-storage Secret and write AWS_SECRET_ACCESS_KEY: ${AWS_SECRET_ACCESS_KEY}"
            ) in leaked.stderr, leaked.stderr


def test_a_literal_credential_in_the_job_spec_is_not_written_into_a_configmap(tmp_path):
    """The job spec's text goes into the CronJob's ConfigMap: a literal secret in its storage_options was published
    there (readable by anyone who can read ConfigMaps); ${VARS} from the datahub-storage Secret are the way."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    raw = {**job_raw(corpus, "s3://lake/prod", storage_options={"AWS_ENDPOINT_URL": "http://rgw:7480",
                                                                "AWS_SECRET_ACCESS_KEY": "hunter2"}), "schedule": "@daily"}
    job = write_job(tmp_path / "literal.yaml", raw)
    with pytest.raises(SpecError, match=r"literal.yaml: lake.storage_options.AWS_SECRET_ACCESS_KEY: a literal credential "
                                        r"would be written into the ConfigMap") as refused:
        render_jobs([job], target="k8s-cronjob", out=tmp_path / "out")
    assert "hunter2" not in str(refused.value)
    assert render_jobs([job], target="airflow", out=tmp_path / "dags")  # a DAG file names the spec, it holds no copy
    # the way: ${VARS} filled in the pod from the Secret. They need not be set where the manifest is rendered (a
    # laptop has no production keys): before, rendering failed "environment variable ... is not set"
    raw["lake"]["storage_options"]["AWS_SECRET_ACCESS_KEY"] = "${DATAHUB_TEST_UNSET_SECRET}"
    raw["lake"]["root"] = "${DATAHUB_TEST_UNSET_LAKE_ROOT}"
    ok = write_job(tmp_path / "from-env.yaml", raw)
    (written,) = render_jobs([ok], target="k8s-cronjob", out=tmp_path / "out")
    config_map = next(yaml.safe_load_all(written.path.read_text()))
    assert "${DATAHUB_TEST_UNSET_SECRET}" in config_map["data"]["from-env.yaml"]


def test_a_crontab_line_names_the_variables_the_job_needs_from_crons_environment(tmp_path):
    """Review finding: cron starts a job with a bare environment, so a spec reading ${AWS_ACCESS_KEY_ID} failed every
    night ("environment variable ... is not set") while the rendered line gave no hint, even when the variables were
    set in the shell that rendered it. The header names them and how to provide them. Also: the flock file was
    /tmp/datahub-<k8s name>.lock, which folds '_' and '.', so jobs web_crawl and web.crawl shared a lock and one
    silently skipped its runs."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    raw = {**job_raw(corpus, "s3://bucket/lake", name="web_crawl",
                     storage_options={"AWS_ACCESS_KEY_ID": "${AWS_ACCESS_KEY_ID}",
                                      "AWS_SECRET_ACCESS_KEY": "${AWS_SECRET_ACCESS_KEY}",
                                      "AWS_REGION": "${AWS_REGION:-us-east-1}"}), "schedule": "@daily"}
    (first,) = render_jobs([write_job(tmp_path / "a.yaml", raw)], target="cron", out=tmp_path / "a")
    text = first.path.read_text()
    assert ("# needs in cron's environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (the job spec reads them as "
            "${VAR}") in text, text
    (second,) = render_jobs([write_job(tmp_path / "b.yaml", {**raw, "name": "web.crawl"})], target="cron",
                            out=tmp_path / "b")

    def lock(path):
        (entry,) = [line for line in path.read_text().splitlines() if line.startswith("@daily ")]
        return shlex.split(entry.split(None, 1)[1])[2]

    assert lock(first.path) != lock(second.path)


def test_a_default_in_a_variable_is_used_when_the_variable_is_unset(tmp_path, monkeypatch):
    """Review finding on 560034e: keeping unset ${VARS} for the scheduled run also kept `${ENGINE:-ray}` as the
    literal '${ENGINE}' (the default was never used), so a spec `datahub run` accepts was refused ("engine.kind: Input
    should be 'ray' or 'spark' (got '${ENGINE}')"), and `root: ${LAKE:-./lake}` skipped the relative-path check."""
    monkeypatch.delenv("DATAHUB_TEST_ENGINE", raising=False)
    monkeypatch.delenv("DATAHUB_TEST_LAKE", raising=False)
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    raw = {**job_raw(corpus, "${DATAHUB_TEST_LAKE:-/data/lake}"), "schedule": "@daily",
           "engine": {"kind": "${DATAHUB_TEST_ENGINE:-ray}"}}
    assert render_jobs([write_job(tmp_path / "dflt.yaml", raw)], target="cron", out=tmp_path / "out")
    relative = write_job(tmp_path / "rel.yaml", {**raw, "lake": {"root": "${DATAHUB_TEST_LAKE:-./lake}"}})
    with pytest.raises(SpecError, match=r"lake.root: './lake' is a relative path"):
        render_jobs([relative], target="cron", out=tmp_path / "out")


def test_an_airflow_dag_names_the_variables_the_job_needs(tmp_path):
    """As the crontab line does: a spec reading ${AWS_ACCESS_KEY_ID} fails on a worker without it, and the DAG file
    said nothing; it names them now (and still compiles)."""
    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=1)
    raw = {**job_raw(corpus, "s3://bucket/lake", storage_options={"AWS_ACCESS_KEY_ID": "${AWS_ACCESS_KEY_ID}",
                                                                  "AWS_REGION": "${AWS_REGION:-us-east-1}"}),
           "schedule": "@daily"}
    (dag,) = render_jobs([write_job(tmp_path / "a.yaml", raw)], target="airflow", out=tmp_path / "dags")
    text = dag.path.read_text()
    assert "# Needs in the Airflow worker's environment: AWS_ACCESS_KEY_ID (the job spec reads them as ${VAR})" in text
    compile(text, str(dag.path), "exec")


def test_configmap_keys_of_job_and_lake_files_with_spaces_are_valid_kubernetes_keys(tmp_path):
    """A ConfigMap's data keys must match [-._a-zA-Z0-9]+ (kubectl apply refuses "a valid config key must consist of
    alphanumeric characters, '-', '_' or '.'"): `night job.yaml` was written as a key as it is, so the manifest of a
    job file with a space in its name could not be applied. The key (and the path the pod reads) now replaces such
    characters with '-'; the file's text is kept."""
    import re

    corpus = make_corpus(tmp_path / "corpus", files=1, per_file=2)
    job = write_job(tmp_path / "night job.yaml", {**job_raw(corpus, "s3://lake/prod", name="night"),
                                                  "schedule": "0 3 * * *"})
    lake_file = tmp_path / "prod lake+eu.yaml"
    lake_file.write_text("root: s3://lake/prod\n")
    (rendered,) = render_jobs([job], target="k8s-cronjob", out=tmp_path / "k8s", lake=str(lake_file))
    config_map, cron = yaml.safe_load_all(rendered.path.read_text())
    assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", key) for key in config_map["data"]), list(config_map["data"])
    assert config_map["data"]["night-job.yaml"] == job.read_text()
    assert config_map["data"]["prod-lake-eu.yaml"] == lake_file.read_text()
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["run", "/etc/datahub/jobs/night-job.yaml", "--lake", "/etc/datahub/jobs/prod-lake-eu.yaml"]


def test_help_and_rendered_files_name_the_exit_codes(jobs, tmp_path):
    """A scheduler branches on exit codes: `schedule render --help` says its own, and the cron line's and the DAG's
    comments say what `datahub run`'s mean (2: the spec or an input is wrong, or the job is already running;
    another non-zero status: the run failed, `datahub runs` shows how to resume). Before, none of them did."""
    from typer.main import get_command

    from datahub.cli.main import app

    render = get_command(app).commands["schedule"].commands["render"]  # type: ignore[attr-defined]
    assert "Exit 0 when every file was written; 2" in " ".join((render.help or "").split())
    for target in ("cron", "airflow"):
        (written,) = render_jobs([jobs[0]], target=target, out=tmp_path / target, lake="/data/lake")
        comments = " ".join(line.lstrip("# ") for line in written.path.read_text().splitlines() if line.startswith("#"))
        assert ("`datahub run` exits 0 when the run succeeded or had nothing new to do, 2 when the spec or an input "
                "is wrong or the job is already running") in comments, comments

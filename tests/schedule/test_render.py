"""`datahub schedule render`: CronJob manifests parse with the right structure; Airflow DAGs compile and run."""

from __future__ import annotations

import ast
import json
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

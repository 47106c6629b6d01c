"""Render scheduled jobs as Kubernetes CronJobs, Airflow DAGs or crontab lines that call ``datahub run``.

The scheduler only triggers; ``datahub run`` is incremental (new input files only), crash-safe
(idempotent commits) and refuses a second concurrent run of the same job (lease), so a retried
trigger or a missed-then-caught-up schedule never duplicates a sample. Overlap is also refused
at the scheduler: ``concurrencyPolicy: Forbid`` / ``max_active_runs=1`` / ``flock -n``.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from datahub.config.spec import JobSpec, load_job_spec
from datahub.errors import SpecError
from datahub.pipeline.graph import build_graph

Target = Literal["k8s-cronjob", "airflow", "cron"]
TARGETS: tuple[Target, ...] = ("k8s-cronjob", "airflow", "cron")
DEFAULT_IMAGE = "datahub:latest"
IMAGE_WORKDIR = "/opt/datahub"  # docker/Dockerfile's WORKDIR
SPEC_MOUNT = "/etc/datahub/jobs"
STORAGE_SECRET = "datahub-storage"  # optional Secret with AWS_* / lake credentials, read via ${VAR} in specs


@dataclass(frozen=True)
class RenderedFile:
    path: Path
    target: Target
    job: str


def k8s_name(job: str) -> str:
    """A DNS-1123 label for ``job``; CronJob names are limited to 52 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")
    return (f"datahub-{name}"[:52]).rstrip("-")


def _schedule(spec: JobSpec, source: str) -> str:
    if not spec.schedule:
        raise SpecError(f"{source}: schedule: missing; add a cron expression to the job spec, e.g. schedule: '0 3 * * *'")
    return spec.schedule


_WHERE_IT_RUNS: dict[str, str] = {
    "airflow": "an Airflow task starts in a temporary directory",
    "k8s-cronjob": f"a CronJob's pod starts in its image's WORKDIR ({IMAGE_WORKDIR} in docker/Dockerfile), not in the "
                   "directory you render from",
    "cron": "cron starts the job in the crontab owner's home directory",
}


def _absolute_paths(spec: JobSpec, source: str, lake: str | None, target: str = "airflow") -> None:
    """Refuse relative local paths: a scheduled run has no working directory of the user's (an Airflow task runs
    in a temporary directory, a pod in its image's WORKDIR, cron in the home directory), so a relative lake would be
    written there and lost, and relative inputs would match nothing. Inputs baked into an image at its WORKDIR
    are refused too (settled in session 37b): they resolve in the pod, but the same path also resolves in the
    checkout the manifest is rendered from, so a wrong one looks right here; their absolute path in the image
    says which files are meant."""
    def relative(path: str) -> bool:
        return "://" not in path and not os.path.isabs(path)

    where = "--lake" if lake else "lake.root"
    root = lake or spec.lake.root
    if relative(root):
        raise SpecError(f"{source}: {where}: {root!r} is a relative path, which a scheduled run resolves against its "
                        f"working directory ({_WHERE_IT_RUNS.get(target, target)}), so the lake would be lost; give an "
                        "absolute path or s3://bucket/prefix"
                        + ("" if lake else ", or pass --lake"))
    for i, item in enumerate(spec.inputs):
        if relative(item.uri):
            fix = "give an absolute path or a URI (s3://, hdfs://)"
            if target == "k8s-cronjob":
                baked = f"{IMAGE_WORKDIR}/{item.uri.removeprefix('./')}"
                fix = (f"give the absolute path the files have in the image or on a mounted volume (e.g. {baked!r} for "
                       "files baked in at the WORKDIR) or a URI (s3://, hdfs://)")
            raise SpecError(f"{source}: inputs.{i}.uri: {item.uri!r} is a relative path, which a scheduled run resolves "
                            f"against its working directory ({_WHERE_IT_RUNS.get(target, target)}); {fix}")


def _run_args(job_path: str, lake: str | None) -> list[str]:
    return ["run", job_path] + (["--lake", lake] if lake else [])


def render_k8s_cronjob(spec: JobSpec, *, spec_text: str, spec_file: str, image: str = DEFAULT_IMAGE,
                       lake: str | None = None, namespace: str | None = None, source: str = "<spec>") -> str:
    """A ConfigMap holding the job spec plus a CronJob running ``datahub run`` on it (multi-document YAML)."""
    import yaml

    name = k8s_name(spec.name)
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "datahub", "datahub/job": name}}
    if namespace:
        meta["namespace"] = namespace
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{name}-spec"},
                  "data": {spec_file: spec_text}}
    container = {
        "name": "datahub",
        "image": image,
        "command": ["datahub"],
        "args": _run_args(f"{SPEC_MOUNT}/{spec_file}", lake),
        "envFrom": [{"secretRef": {"name": STORAGE_SECRET, "optional": True}}],
        "volumeMounts": [{"name": "job-spec", "mountPath": SPEC_MOUNT, "readOnly": True}],
    }
    cron_job = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": meta,
        "spec": {
            "schedule": _schedule(spec, source),
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",  # the lease refuses overlap too; this avoids even starting a pod
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 5,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 3,  # safe: a re-run resumes the same run id and skips committed tables
                    "template": {
                        "metadata": {"labels": meta["labels"]},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [container],
                            "volumes": [{"name": "job-spec", "configMap": {"name": f"{name}-spec"}}],
                        },
                    },
                }
            },
        },
    }
    header = f"# Rendered by `datahub schedule render --target k8s-cronjob` from {source}; apply with kubectl apply -f\n"
    return header + yaml.safe_dump_all([config_map, cron_job], sort_keys=False)


_DAG_TEMPLATE = '''"""Airflow DAG for datahub job {job!r}, rendered by `datahub schedule render --target airflow` from {source}."""

from datetime import datetime, timedelta

from airflow import DAG

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

JOB_COMMAND = {command!r}

with DAG(
    dag_id={dag_id!r},
    description={description!r},
    schedule={schedule!r},
    start_date=datetime(2024, 1, 1),
    catchup=False,  # an incremental run picks up everything new since the last one anyway
    max_active_runs=1,  # the job lease refuses overlapping runs too
    default_args={{"retries": 3, "retry_delay": timedelta(minutes=5)}},
    tags=["datahub"],
) as dag:
    BashOperator(task_id="datahub_run", bash_command=JOB_COMMAND)
'''


def render_airflow_dag(spec: JobSpec, *, job_path: str, lake: str | None = None, source: str = "<spec>") -> str:
    """A DAG file with one BashOperator running ``datahub run job_path`` on the schedule."""
    command = " ".join(shlex.quote(a) for a in ["datahub", *_run_args(job_path, lake)])
    return _DAG_TEMPLATE.format(job=spec.name, source=source, command=command, dag_id=f"datahub_{spec.name}".replace("-", "_"),
                                description=spec.description or f"datahub run {spec.name}", schedule=_schedule(spec, source))


def datahub_executable() -> list[str]:
    """This installation's ``datahub`` by absolute path (cron's PATH is /usr/bin:/bin, without the virtualenv)."""
    script = Path(sys.executable).with_name("datahub")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [os.path.abspath(sys.executable), "-m", "datahub.cli.main"]


def render_crontab(spec: JobSpec, *, job_path: str, lake: str | None = None, source: str = "<spec>",
                   path: str = "THIS_FILE") -> str:
    """One crontab line running ``datahub run job_path`` on the schedule, under ``flock -n`` (overlap skipped)."""
    lock = f"/tmp/datahub-{k8s_name(spec.name).removeprefix('datahub-')}.lock"
    command = " ".join(shlex.quote(a) for a in ["flock", "-n", lock, *datahub_executable(), *_run_args(job_path, lake)])
    command = command.replace("%", "\\%")  # cron turns an unescaped % into a newline
    return (f"# datahub job {spec.name!r}, rendered by `datahub schedule render --target cron` from {source}.\n"
            f"# Install: (crontab -l 2>/dev/null; cat {shlex.quote(path)}) | crontab -\n"
            "# The schedule is in the cron daemon's time zone (the k8s-cronjob and airflow renders use UTC). flock -n\n"
            "# skips a start while the previous run still holds the lock; cron mails what the run prints (set MAILTO, or\n"
            "# append >> LOGFILE 2>&1); `datahub runs --lake LAKE` lists runs, a failed one with its resume command.\n"
            f"{_schedule(spec, source)} {command}\n")


def render_jobs(job_files: list[str | os.PathLike[str]], *, target: Target, out: str | os.PathLike[str],
                image: str = DEFAULT_IMAGE, lake: str | None = None, jobs_dir: str | None = None,
                namespace: str | None = None) -> list[RenderedFile]:
    """Validate each job spec and write one manifest (k8s), DAG file (airflow) or crontab line (cron) per job
    under ``out``.

    ``jobs_dir``: where the job files live on the Airflow workers or the cron host (default: their absolute path
    here).
    """
    if target not in TARGETS:
        raise SpecError(f"--target {target!r}: choose one of {', '.join(TARGETS)}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[RenderedFile] = []
    rendered_from: list[str] = []
    texts: list[str] = []
    for job_file in job_files:
        source = os.fspath(job_file)
        spec = load_job_spec(source)
        build_graph(spec, source=source)  # unknown operators, bad params, cycles: refused before rendering
        _schedule(spec, source)
        _absolute_paths(spec, source, lake, target)
        if target == "k8s-cronjob":
            text = render_k8s_cronjob(spec, spec_text=Path(source).read_text(), spec_file=Path(source).name,
                                      image=image, lake=lake, namespace=namespace, source=source)
            path = out_dir / f"{k8s_name(spec.name)}.yaml"
        elif target == "cron":
            job_path = f"{jobs_dir.rstrip('/')}/{Path(source).name}" if jobs_dir else str(Path(source).resolve())
            path = out_dir / f"{k8s_name(spec.name)}.cron"
            text = render_crontab(spec, job_path=job_path, lake=lake, source=source, path=str(path.resolve()))
        else:
            job_path = f"{jobs_dir.rstrip('/')}/{Path(source).name}" if jobs_dir else str(Path(source).resolve())
            text = render_airflow_dag(spec, job_path=job_path, lake=lake, source=source)
            path = out_dir / f"datahub_{spec.name.replace('-', '_').replace('.', '_')}.py"
        earlier = next((i for i, w in enumerate(written) if w.path == path), None)
        if earlier is not None:  # one file (and one CronJob / DAG id) per job: the second would replace the first
            raise SpecError(f"{source}: name: job {spec.name!r} renders to {path}, as job {written[earlier].job!r} of "
                            f"{rendered_from[earlier]} does; give each scheduled job its own name")
        written.append(RenderedFile(path=path, target=target, job=spec.name))
        rendered_from.append(source)
        texts.append(text)
    for rendered, text in zip(written, texts):  # nothing is written unless every job rendered
        rendered.path.write_text(text)
    return written

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

from datahub.config.spec import JobSpec
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


def configmap_key(file_name: str) -> str:
    """``file_name`` as a ConfigMap data key, which must match ``[-._a-zA-Z0-9]+`` (Kubernetes refuses others):
    each other character becomes '-' (``night job.yaml`` -> ``night-job.yaml``)."""
    return re.sub(r"[^-._a-zA-Z0-9]", "-", file_name)


class _KeepUnset(dict):  # type: ignore[type-arg]
    """The environment for ``expand_env`` at render time: a ``${VAR}`` set here expands, ``${VAR:-default}`` unset
    here takes its default (as ``datahub run`` would), and ``${VAR}`` unset and without a default stays as written
    (the scheduled run's environment fills it: the pod's Secret, the Airflow worker's env). ``keep``: those names."""

    def __init__(self, keep: set[str]) -> None:
        super().__init__()
        self.keep = keep

    def __contains__(self, name: object) -> bool:
        return name in os.environ or name in self.keep

    def __getitem__(self, name: str) -> str:
        return os.environ.get(name, f"${{{name}}}")


def _load_spec(source: str) -> JobSpec:
    """The job spec validated as ``load_job_spec`` does, except that unset ``${VARS}`` without a default are kept
    (see _KeepUnset)."""
    from datahub.config.spec import expand_env, validate_job_spec
    from datahub.config.yaml_file import read_yaml

    raw = read_yaml(source, missing="job spec not found; check the path (e.g. jobs/demo.yaml)")
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping with name, lake, inputs and graph")
    keep = {name for name in needed_variables(Path(source).read_text()) if name not in os.environ}
    return validate_job_spec(expand_env(raw, _KeepUnset(keep), source=source), source=source)


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
    def relative(path: str) -> bool:  # a ${VAR} left for the scheduled run's environment is not judged here
        return "://" not in path and not os.path.isabs(path) and "${" not in path

    from datahub.config.lake_file import is_lake_file

    where = "--lake" if lake else "lake.root"
    root = lake or spec.lake.root
    if relative(root) and not (lake and is_lake_file(lake)):  # a lake YAML's own root is checked by _lake_file
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


_CREDENTIAL = re.compile(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY|SESSION", re.IGNORECASE)


def _lake_file(lake: str | None, target: str) -> tuple[str, str] | None:
    """(file name, text) of a ``--lake`` lake YAML, checked for what a scheduled run needs: an absolute (or URI)
    root, and, for a CronJob (the text goes into a ConfigMap), credentials as ``${VARS}`` (from the Secret), not
    literal values. The text is kept as written: its ``${VARS}`` expand in the scheduled run's environment."""
    from datahub.config.lake_file import is_lake_file
    from datahub.config.yaml_file import read_yaml

    if lake is None or not is_lake_file(lake):
        return None
    raw = read_yaml(Path(lake), missing="lake file not found; --lake takes a lake root or a YAML with root: and "
                                         "storage_options:")
    if isinstance(raw, dict) and isinstance(raw.get("lake"), dict):
        raw = raw["lake"]  # a job spec's lake: section
    raw = raw if isinstance(raw, dict) else {}
    root = raw.get("root")
    if isinstance(root, str) and "${" not in root and "://" not in root and not os.path.isabs(root):
        raise SpecError(f"{lake}: root: {root!r} is a relative path, which a scheduled run resolves against its "
                        f"working directory ({_WHERE_IT_RUNS.get(target, target)}), so the lake would be lost; give "
                        "an absolute path or s3://bucket/prefix")
    if target == "k8s-cronjob":
        _no_literal_credentials(raw.get("storage_options"), f"{lake}: storage_options")
    return Path(lake).name, Path(lake).read_text()


def _no_literal_credentials(options: object, where: str) -> None:
    """Refuse a literal secret in storage options whose file goes into a ConfigMap (readable by whoever reads
    ConfigMaps); the value is never echoed."""
    if not isinstance(options, dict):
        return
    for key, value in options.items():
        if _CREDENTIAL.search(str(key)) and isinstance(value, str) and "${" not in value:
            raise SpecError(f"{where}.{key}: a literal credential would be written into the ConfigMap; put it in the "
                            f"{STORAGE_SECRET} Secret and write {key}: ${{{key}}}")


def _spec_credentials(source: str) -> None:
    """The job spec as written (before ${VAR} expansion) holds no literal credential in its storage options."""
    from datahub.config.yaml_file import read_yaml

    raw = read_yaml(Path(source), missing="job spec not found")
    if not isinstance(raw, dict):
        return
    lake = raw.get("lake")
    if isinstance(lake, dict):
        _no_literal_credentials(lake.get("storage_options"), f"{source}: lake.storage_options")
    for i, item in enumerate(raw.get("inputs") or []):
        if isinstance(item, dict):
            _no_literal_credentials(item.get("storage_options"), f"{source}: inputs.{i}.storage_options")


def _run_args(job_path: str, lake: str | None) -> list[str]:
    return ["run", job_path] + (["--lake", lake] if lake else [])


def render_k8s_cronjob(spec: JobSpec, *, spec_text: str, spec_file: str, image: str = DEFAULT_IMAGE,
                       lake: str | None = None, namespace: str | None = None, source: str = "<spec>",
                       lake_file: tuple[str, str] | None = None) -> str:
    """A ConfigMap holding the job spec (and the ``--lake`` lake YAML, ``lake_file``: name and text) plus a CronJob
    running ``datahub run`` on it (multi-document YAML)."""
    import yaml

    name = k8s_name(spec.name)
    meta = {"name": name, "labels": {"app.kubernetes.io/name": "datahub", "datahub/job": name}}
    if namespace:
        meta["namespace"] = namespace
    data = {spec_file: spec_text}
    if lake_file is not None:  # the pod has no file of the rendering machine: it reads the lake YAML from the mount
        lake_name = configmap_key(lake_file[0])
        lake_name = lake_name if lake_name != spec_file else f"lake-{lake_name}"
        data[lake_name] = lake_file[1]
        lake = f"{SPEC_MOUNT}/{lake_name}"
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{name}-spec"},
                  "data": data}
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
{needs}
from datetime import datetime, timedelta

from airflow import DAG

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

# {exit_codes}
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


# What a scheduler sees of `datahub run` (its --help says the same); a comment in the cron line and the DAG.
RUN_EXIT_CODES = ("`datahub run` exits 0 when the run succeeded or had nothing new to do, 2 when the spec or an input "
                  "is wrong or the job is already running,\n# another non-zero status when the run failed (`datahub "
                  "runs --lake LAKE` shows its error and the command that resumes it).")


def render_airflow_dag(spec: JobSpec, *, job_path: str, lake: str | None = None, source: str = "<spec>",
                       needs: list[str] | None = None) -> str:
    """A DAG file with one BashOperator running ``datahub run job_path`` on the schedule; ``needs``: the ``${VARS}``
    the spec reads (``needed_variables``), named in a comment."""
    command = " ".join(shlex.quote(a) for a in ["datahub", *_run_args(job_path, lake)])
    note = (f"\n# Needs in the Airflow worker's environment: {', '.join(needs)} (the job spec reads them as ${{VAR}}).\n"
            if needs else "")
    return _DAG_TEMPLATE.format(job=spec.name, source=source, command=command, dag_id=f"datahub_{spec.name}".replace("-", "_"),
                                description=spec.description or f"datahub run {spec.name}", schedule=_schedule(spec, source),
                                needs=note, exit_codes=RUN_EXIT_CODES)


def datahub_executable() -> list[str]:
    """This installation's ``datahub`` by absolute path (cron's PATH is /usr/bin:/bin, without the virtualenv)."""
    script = Path(sys.executable).with_name("datahub")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [os.path.abspath(sys.executable), "-m", "datahub.cli.main"]


def needed_variables(*texts: str) -> list[str]:
    """The ``${VAR}`` names (without a ``:-default``) that the given spec or lake YAML texts read."""
    from datahub.config.spec import _ENV_REF

    return sorted({m.group(1) for text in texts for m in _ENV_REF.finditer(text) if m.group(2) is None})


def render_crontab(spec: JobSpec, *, job_path: str, lake: str | None = None, source: str = "<spec>",
                   path: str = "THIS_FILE", needs: list[str] | None = None) -> str:
    """One crontab line running ``datahub run job_path`` on the schedule, under ``flock -n`` (overlap skipped).

    ``needs``: the ``${VARS}`` the spec reads (``needed_variables``), which cron's bare environment lacks."""
    import hashlib

    # one lock per job name: k8s_name folds '_' and '.', so it alone would make two jobs skip each other
    digest = hashlib.sha256(spec.name.encode()).hexdigest()[:8]
    lock = f"/tmp/datahub-{k8s_name(spec.name).removeprefix('datahub-')}-{digest}.lock"
    command = " ".join(shlex.quote(a) for a in ["flock", "-n", lock, *datahub_executable(), *_run_args(job_path, lake)])
    command = command.replace("%", "\\%")  # cron turns an unescaped % into a newline
    environment = ""
    if needs:
        environment = (f"# needs in cron's environment: {', '.join(needs)} (the job spec reads them as ${{VAR}}; cron "
                       "starts jobs with a\n# bare environment): put VAR=value lines above this entry in the crontab, "
                       "or start the command with\n# `. /etc/datahub/env && ` (a file that exports them).\n")
    return (f"# datahub job {spec.name!r}, rendered by `datahub schedule render --target cron` from {source}.\n"
            f"# Install: (crontab -l 2>/dev/null; cat {shlex.quote(path)}) | crontab -\n" + environment +
            "# The schedule is in the cron daemon's time zone (the k8s-cronjob and airflow renders use UTC). flock -n\n"
            "# skips a start while the previous run still holds the lock; cron mails what the run prints (set MAILTO, or\n"
            "# append >> LOGFILE 2>&1); `datahub runs --lake LAKE` lists runs, a failed one with its resume command.\n"
            f"# {RUN_EXIT_CODES}\n"
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
        spec = _load_spec(source)
        build_graph(spec, source=source)  # unknown operators, bad params, cycles: refused before rendering
        _schedule(spec, source)
        _absolute_paths(spec, source, lake, target)
        lake_file = _lake_file(lake, target)
        if lake_file is not None and lake is not None and target != "k8s-cronjob":
            lake = str(Path(lake).resolve())  # read on this host (cron) or the workers (airflow), as the job file is
        if target == "k8s-cronjob":
            _spec_credentials(source)
            text = render_k8s_cronjob(spec, spec_text=Path(source).read_text(), spec_file=configmap_key(Path(source).name),
                                      image=image, lake=lake, namespace=namespace, source=source, lake_file=lake_file)
            path = out_dir / f"{k8s_name(spec.name)}.yaml"
        elif target == "cron":
            job_path = f"{jobs_dir.rstrip('/')}/{Path(source).name}" if jobs_dir else str(Path(source).resolve())
            path = out_dir / f"{k8s_name(spec.name)}.cron"
            needs = needed_variables(Path(source).read_text(), lake_file[1] if lake_file else "")
            text = render_crontab(spec, job_path=job_path, lake=lake, source=source, path=str(path.resolve()),
                                  needs=needs)
        else:
            job_path = f"{jobs_dir.rstrip('/')}/{Path(source).name}" if jobs_dir else str(Path(source).resolve())
            text = render_airflow_dag(spec, job_path=job_path, lake=lake, source=source,
                                      needs=needed_variables(Path(source).read_text(), lake_file[1] if lake_file else ""))
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

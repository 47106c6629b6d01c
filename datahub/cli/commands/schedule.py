"""`datahub schedule render`: Kubernetes CronJobs or Airflow DAGs that run job specs on their cron schedule."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, cast

import typer

from datahub.cli.output import console, print_json


EXAMPLES = """Examples:
  datahub schedule render jobs/nightly.yaml --target cron --out deploy/
  datahub schedule render jobs/nightly.yaml --target k8s-cronjob \\
      --lake lake.yaml --image registry/datahub:1.4
  datahub schedule render jobs/nightly.yaml --target airflow --out dags/"""


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Run jobs on a schedule with an existing scheduler (cron, Kubernetes, Airflow).",
                        no_args_is_help=True)
    app.add_typer(group, name="schedule")

    @group.command("render", epilog=EXAMPLES)
    def render(
        jobs: list[Path] = typer.Argument(..., help="Job spec YAML files with a `schedule:` cron field."),
        target: str = typer.Option(..., "--target", help="k8s-cronjob | airflow | cron (a crontab line)."),
        out: str = typer.Option("deploy", "--out", metavar="DIR", help="Directory to write manifests / DAG files / crontab lines into."),
        image: str = typer.Option("datahub:latest", "--image", help="Container image for k8s-cronjob (see docker/)."),
        lake: Optional[str] = typer.Option(None, "--lake", help="Pass --lake to `datahub run`: a lake root as the scheduled pod/worker sees it, or a lake YAML (root + storage_options; shipped in the CronJob's ConfigMap)."),
        jobs_dir: Optional[str] = typer.Option(None, "--jobs-dir", help="airflow, cron: where the job files live on the workers / cron host (default: their absolute path here)."),
        namespace: Optional[str] = typer.Option(None, "--namespace", help="k8s-cronjob: metadata.namespace."),
        as_json: bool = typer.Option(False, "--json", help="Print the written files as JSON."),
    ) -> None:
        """Write one CronJob manifest (concurrencyPolicy Forbid), Airflow DAG or crontab line (flock -n) per job; each
        calls `datahub run`. Lake and input paths must be absolute (a scheduled run does not start in this directory).
        Exit 0 when every file was written; 2 when a spec, path or option is refused (then nothing is written)."""
        from datahub.cli.arguments import given
        from datahub.schedule.render import Target, render_jobs

        given(out, "--out", what="the directory to write the manifests, DAGs or crontab lines into")
        given(lake, "--lake", what="the lake the scheduled run writes to, or drop --lake to use the spec's")

        written = render_jobs([str(j) for j in jobs], target=cast(Target, target), out=Path(out), image=image, lake=lake,
                              jobs_dir=jobs_dir, namespace=namespace)
        if as_json:
            print_json([{"job": w.job, "target": w.target, "path": str(w.path)} for w in written])
            return
        for w in written:
            console().print(f"[green]wrote[/] {w.path}  ({w.target}, job {w.job})")

"""Scheduling without a home-made scheduler: render job specs for Kubernetes CronJob or Airflow.

``datahub.config.cron`` validates cron expressions; ``render`` writes the manifests/DAGs that
call ``datahub run JOB`` (incremental and crash-safe, so a retried or overlapping trigger is harmless).
"""

from datahub.config.cron import validate_cron
from datahub.schedule.render import RenderedFile, render_airflow_dag, render_jobs, render_k8s_cronjob

__all__ = ["RenderedFile", "render_airflow_dag", "render_jobs", "render_k8s_cronjob", "validate_cron"]

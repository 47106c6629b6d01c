"""`datahub runs --lake LAKE`: the runs of each job with status, counts, durations and how to resume."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Optional

import typer

from datahub.cli.lake_option import LAKE_ARGUMENT_HELP, LAKE_HELP, lake_ref
from datahub.cli.output import console, print_json


def list_runs(root: str, *, job: str | None = None, storage_options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Runs recorded in the lake's ``runs`` table plus runs seen only through their lease.

    status: succeeded | failed (its error and a resume hint) | running (lease held) |
    interrupted (a lease left by a killed run: no ``runs`` row, holder gone or expired).
    A failed row whose run id later succeeded is marked ``resumed``.
    """
    from datahub.cli.lake_option import open_lake
    from datahub.pipeline.lease import list_leases, rerun_command

    lake = open_lake(root, storage_options=storage_options)
    table = lake.read("runs")
    rows = table.to_pylist() if table.num_rows else []
    succeeded = {r["run_id"] for r in rows if r["status"] == "succeeded"}
    recorded = {r["run_id"] for r in rows}
    out: list[dict[str, Any]] = []
    for r in rows:
        if job and r["job_name"] != job:
            continue
        counts = json.loads(r["counts"] or "{}")
        item = {
            "run_id": r["run_id"], "job": r["job_name"], "status": r["status"], "engine": r["engine"],
            "started": r["started"], "finished": r["finished"],
            "duration_s": counts.get("duration_s") or _seconds(r["started"], r["finished"]),
            "inputs": len(r["inputs"] or []),
            "records_read": counts.get("records_read", 0), "samples_written": counts.get("samples_written", 0),
            "dropped": counts.get("dropped_total", 0), "quarantined": counts.get("quarantined_total", 0),
            "error": r["error"], "hint": None,
        }
        if r["status"] == "failed":
            if r["run_id"] in succeeded:
                item["status"] = "failed (resumed)"
            else:  # job_spec and full are null in lakes written before they were recorded
                command = rerun_command(r["job_name"], job_spec=r.get("job_spec"), lake=lake.root, full=bool(r.get("full")))
                item["hint"] = f"fix the error above, then re-run (it completes this run first): {command}"
        out.append(item)
    for lease in list_leases(lake):
        if job and lease.job != job:
            continue
        if lease.run_id in succeeded:
            continue  # killed after its runs row: nothing to resume
        if lease.run_id in recorded and lease.is_stale():
            continue  # a failed run left its plan behind: its runs row above already says how to resume
        stale = lease.is_stale()
        out.append({
            "run_id": lease.run_id, "job": lease.job, "status": "interrupted" if stale else "running", "engine": None,
            "started": datetime.fromtimestamp(lease.acquired, timezone.utc), "finished": None,
            "duration_s": None if stale else round(datetime.now(timezone.utc).timestamp() - lease.acquired, 1),
            "inputs": None, "records_read": None, "samples_written": None, "dropped": None, "quarantined": None,
            "error": "the run stopped without recording a result (killed?)" if stale else None,
            "hint": f"interrupted, re-run with: {lease.rerun_command()}" if stale else f"lease {lease.describe()}",
        })
    out.sort(key=lambda item: item["started"] or datetime.min.replace(tzinfo=timezone.utc))
    return out


def _seconds(started: datetime | None, finished: datetime | None) -> float | None:
    return round((finished - started).total_seconds(), 3) if started and finished else None


def register(app: typer.Typer) -> None:
    @app.command("runs")
    def runs(
        lake_arg: Optional[str] = typer.Argument(None, metavar="LAKE", help=LAKE_ARGUMENT_HELP, show_default=False),
        lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
        job: Optional[str] = typer.Option(None, "--job", help="Only runs of this job."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List runs with status, counts and durations; failed or interrupted runs say how to resume."""
        from rich.markup import escape
        from rich.table import Table

        lake = lake_ref(lake_arg, lake, command="runs")
        items = list_runs(lake, job=job)
        if as_json:
            print_json(items)
            return
        out = console()
        if not items:
            out.print(f"no runs recorded in {lake}" + (f" for job {job!r}" if job else ""))
            return
        grid = Table(title=f"runs in {lake}")
        for column in ("run", "job", "status", "started", "duration", "inputs", "read", "written", "dropped", "quarantined"):
            # fold, never "…": a run id must copy whole even on a narrow terminal
            grid.add_column(column, justify="left" if column in ("run", "job", "status", "started") else "right", overflow="fold")
        colors = {"succeeded": "green", "failed": "red", "interrupted": "yellow", "running": "cyan"}
        for i in items:
            status = f"[{colors.get(i['status'], 'white')}]{i['status']}[/]"
            started = i["started"].strftime("%Y-%m-%d %H:%M:%S") if i["started"] else ""
            grid.add_row(escape(str(i["run_id"])), escape(i["job"]), status, started,
                         "" if i["duration_s"] is None else f"{i['duration_s']:.1f}s",
                         *("" if i[k] is None else str(i[k]) for k in ("inputs", "records_read", "samples_written", "dropped", "quarantined")))
        out.print(grid)
        for i in items:
            if i["status"] in ("failed", "interrupted"):
                first = (i["error"] or "").splitlines()[0] if i["error"] else ""
                out.print(f"[bold]{escape(str(i['run_id']))}[/] {i['status']}: {escape(first)}", soft_wrap=True)
                if i["hint"]:  # never wrapped: the command must paste as one line
                    out.print(f"  {escape(i['hint'])}", soft_wrap=True)

"""`datahub runs --lake LAKE`: the runs of each job with status, counts, durations and how to resume."""

from __future__ import annotations

from typing import Optional

import typer

from datahub.cli.lake_option import LAKE_ARGUMENT_HELP, LAKE_HELP, lake_ref
from datahub.cli.output import console, fits, print_json


EXAMPLES = """Examples:
  datahub runs --lake lake/demo
  datahub runs --lake lake/demo --job demo --json"""


def register(app: typer.Typer) -> None:
    @app.command("runs", epilog=EXAMPLES)
    def runs(
        lake_arg: Optional[str] = typer.Argument(None, metavar="LAKE", help=LAKE_ARGUMENT_HELP, show_default=False),
        lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
        job: Optional[str] = typer.Option(None, "--job", help="Only runs of this job."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """List runs with status, counts and durations; failed or interrupted runs say how to resume."""
        from rich.markup import escape
        from rich.table import Table

        from datahub.cli.lake_option import open_lake
        from datahub.lake.timestamps import iso_utc
        from datahub.pipeline.history import list_runs

        from datahub.cli.arguments import given

        given(job, "--job", what="a job name (`datahub runs --lake LAKE` lists them), or drop --job")
        lake = lake_ref(lake_arg, lake, command="runs")
        the_lake = open_lake(lake)
        items = list_runs(the_lake, job=job)
        if not items:
            jobs = sorted({str(i["job"]) for i in list_runs(the_lake)}) if job else []  # a typo names what is there
            nothing = (f"no runs recorded in {escape(lake)}" + (f" for job {escape(repr(job))}" if job else "")
                       + (f" (jobs there: {escape(', '.join(jobs))})" if jobs else ""))
            if as_json:  # `[]` on stdout; the why on stderr, so a script's log shows a mistyped --job
                print_json(items)
                console(stderr=True).print(f"note: {nothing}", soft_wrap=True)
            else:
                console().print(nothing, soft_wrap=True)
            return
        if as_json:  # date-times as ISO 8601 UTC with 'Z', as every --json prints them
            print_json([{**i, "started": iso_utc(i["started"]), "finished": iso_utc(i["finished"])} for i in items])
            return
        out = console()
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
        if fits(out, grid):
            out.print(grid)
        else:  # a narrow terminal: a run per two lines, the id whole on the first (a folded id cannot be copied)
            out.print(f"runs in {escape(lake)}", soft_wrap=True)
            for i in items:
                started = i["started"].strftime("%Y-%m-%d %H:%M:%S") if i["started"] else "-"
                duration = "" if i["duration_s"] is None else f"  {i['duration_s']:.1f}s"
                out.print(f"[bold]{escape(str(i['run_id']))}[/]  [{colors.get(i['status'], 'white')}]{i['status']}[/]  "
                          f"{started}{duration}", soft_wrap=True)
                counts = ", ".join(f"{i[k]} {label}" for k, label in (
                    ("inputs", "input files"), ("records_read", "read"), ("samples_written", "written"),
                    ("dropped", "dropped"), ("quarantined", "quarantined")) if i[k] is not None)
                out.print(f"  job {escape(i['job'])}" + (f": {counts}" if counts else ""), soft_wrap=True)
        for i in items:
            if i["status"] in ("failed", "interrupted"):
                first = (i["error"] or "").splitlines()[0] if i["error"] else ""
                out.print(f"[bold]{escape(str(i['run_id']))}[/] {i['status']}: {escape(first)}", soft_wrap=True)
                if i["hint"]:  # never wrapped: the command must paste as one line
                    out.print(f"  {escape(i['hint'])}", soft_wrap=True)

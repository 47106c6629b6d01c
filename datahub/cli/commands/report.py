"""`datahub report --lake LAKE --out DIR`: an HTML report with plots of a samples table version."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from datahub.cli.lake_option import LAKE_ARGUMENT_HELP, LAKE_HELP, lake_ref
from datahub.cli.output import console, print_json, progress
from datahub.cli.release_option import RELEASE_HELP


EXAMPLES = """Examples:
  datahub report --lake lake/demo --out report/
  datahub report --lake lake/demo --out report-v1/ --release corpus-v1"""


def register(app: typer.Typer) -> None:
    @app.command("report", epilog=EXAMPLES)
    def report(
        lake_arg: Optional[str] = typer.Argument(None, metavar="LAKE", help=LAKE_ARGUMENT_HELP, show_default=False),
        lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
        out: str = typer.Option(..., "--out", metavar="DIR", help="Directory for index.html and its PNG plots."),
        version: Optional[int] = typer.Option(None, "--version", help="Samples table version (default: latest)."),
        table: str = typer.Option("samples", "--table", help="Lake table to report on."),
        release: Optional[str] = typer.Option(None, "--release", help=RELEASE_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
    ) -> None:
        """Write quality-signal distributions, drop reasons, language mix, duplicate clusters, sources."""
        from datahub.cli.arguments import given
        from datahub.cli.lake_option import open_lake
        from datahub.cli.release_option import release_table

        given(out, "--out", what="the directory to write index.html and its plots into")
        from datahub.report import build_report

        the_lake = open_lake(lake_ref(lake_arg, lake, command="report"))
        table, version = release_table(the_lake, release, table, version)
        with progress(f"report {table}", enabled=not as_json) as update:
            written = build_report(the_lake, out_dir=Path(out), table=table, version=version, progress=update)
        if as_json:
            print_json(written.as_dict())
        else:
            console().print(f"report written: {written.index} ({len(written.plots)} plots)")

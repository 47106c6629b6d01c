"""`datahub report LAKE --out DIR`: an HTML report with plots of a samples table version."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from datahub.cli.output import console, print_json


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        lake: str = typer.Argument(..., help="Lake root: a path or s3://bucket/prefix."),
        out: Path = typer.Option(..., "--out", help="Directory for index.html and its PNG plots."),
        version: Optional[int] = typer.Option(None, "--version", help="Samples table version (default: latest)."),
        table: str = typer.Option("samples", "--table", help="Lake table to report on."),
        as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
    ) -> None:
        """Write quality-signal distributions, drop reasons, language mix, duplicate clusters, sources."""
        from datahub.cli.lake_option import open_lake
        from datahub.report import build_report

        written = build_report(open_lake(lake), out_dir=out, table=table, version=version)
        if as_json:
            print_json(written.as_dict())
        else:
            console().print(f"report written: {written.index} ({len(written.plots)} plots)")

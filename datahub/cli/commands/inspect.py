"""`datahub inspect --lake LAKE [TABLE]`: tables, schemas, versions, row counts."""

from __future__ import annotations

from typing import Optional

import typer

from datahub.cli.lake_option import LAKE_ARGUMENT_HELP, LAKE_HELP, lake_ref
from datahub.cli.output import console, plain, print_json


EXAMPLES = """Examples:
  # every table: Delta version, rows, files
  datahub inspect --lake lake/demo
  # one table: schema, rows per kind, history
  datahub inspect --lake lake/demo samples --json"""


def register(app: typer.Typer) -> None:
    @app.command("inspect", epilog=EXAMPLES)
    def inspect(
        lake_arg: Optional[str] = typer.Argument(None, metavar="LAKE", help=LAKE_ARGUMENT_HELP, show_default=False),
        table: Optional[str] = typer.Argument(None, help="One table to describe in detail (schema, history)."),
        lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Show the lake's tables with their Delta versions and row counts (or one table in detail)."""
        from rich.table import Table

        if lake is not None and lake_arg is not None and table is None:  # `inspect --lake L TABLE`
            lake_arg, table = None, lake_arg
        from datahub.cli.lake_option import open_lake
        from datahub.lake.describe import describe_lake

        info = describe_lake(open_lake(lake_ref(lake_arg, lake, command="inspect")), table)
        if as_json:
            print_json(info)
            return
        out = console()
        if not info["tables"]:
            out.print(f"no Delta tables under {info['lake']}")
            return
        grid = Table(title=f"lake {info['lake']}")
        for column in ("table", "version", "rows", "files", "schema v"):
            grid.add_column(column, justify="right" if column != "table" else "left")
        for name, t in info["tables"].items():
            grid.add_row(name, str(t["version"]), "unknown" if t["rows"] is None else str(t["rows"]), str(t["files"]),
                         str(t["schema_version"]))
        out.print(grid)
        for name, t in info["tables"].items():
            if t.get("rows_unknown"):  # a table with deletion vectors that cannot be read, or without row counts
                out.print(f"{plain(name)}: rows unknown: {plain(t['rows_unknown'])}", soft_wrap=True)
        if table:
            t = info["tables"][table]
            out.print("[bold]schema[/]")
            for f in t["schema"]:
                out.print(f"  {f['name']}: {f['type']}")
            if "kinds" in t:  # rows per sample kind (a null kind is text)
                out.print("[bold]kinds[/]")
                if t["kinds"] is None:  # deletion vectors that had to be read could not be, or disagree with the log
                    out.print(f"  unknown: {plain(t['kinds_unknown'])}", soft_wrap=True)
                for kind, rows in (t["kinds"] or {}).items():
                    out.print(f"  {plain(kind)}: {rows}")
            out.print("[bold]history[/]")
            for h in t["history"]:
                out.print(f"  v{h['version']} {h['operation']} txn={h['txn']}")

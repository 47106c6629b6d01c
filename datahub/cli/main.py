"""The ``datahub`` command line: a thin layer over the Python API.

Each module in ``datahub/cli/commands/`` defines ``register(app)``; they are found by name,
so adding a command group never edits this file. Command modules import heavy libraries
(ray, pyspark, great_expectations) inside the command functions, keeping --help fast.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from datahub import __version__
from datahub.errors import DatahubError

app = typer.Typer(
    name="datahub",
    help="Data-lake pipelines for LLM training corpora: ingest, dedup, quality, versioned releases, "
    "lineage, WebDataset export on tiered storage.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"datahub {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """datahub: see `datahub COMMAND --help` for each command."""


def _register_commands() -> None:
    from datahub.cli import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{info.name}").register(app)


_register_commands()


def main() -> None:
    try:
        app()
    except DatahubError as exc:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()

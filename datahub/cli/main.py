"""The ``datahub`` command line: a thin layer over the Python API.

Each module in ``datahub/cli/commands/`` defines ``register(app)``; they are found by name,
so adding a command group never edits this file. Command modules import heavy libraries
(ray, pyspark, great_expectations) inside the command functions, keeping --help fast.
"""

from __future__ import annotations

import errno
import importlib
import pkgutil
import sys
from typing import Any

import typer

try:  # typer >= 0.22 carries its own copy of click; its usage errors are of that copy's classes
    from typer._click import exceptions as _click_errors
except ImportError:  # pragma: no cover - a typer on the click package
    from click import exceptions as _click_errors  # type: ignore[no-redef]
# click < 8.2 has no NoArgsIsHelpError: an `except` naming a missing attribute turned every error into a traceback
_NO_ARGS_IS_HELP: Any = getattr(_click_errors, "NoArgsIsHelpError", ())

from datahub import __version__
from datahub.allocator import use_system_allocator
from datahub.errors import DatahubError

# a new user's first session, as README.md and `make demo` go: each command's own --help has more
FIRST_STEPS = """Examples (the bundled demo, from the repository's root):
  datahub run jobs/demo.yaml
  datahub runs --lake lake/demo
  datahub inspect --lake lake/demo samples
  datahub quarantine --lake lake/demo
  datahub lineage --source data/demo/docs-a.jsonl.gz --lake lake/demo
  datahub release create demo-v1 --lake lake/demo
  datahub export demo-v1 --lake lake/demo --tier cfs \\
      --storage jobs/storage.demo.yaml"""

app = typer.Typer(
    name="datahub",
    help="Data-lake pipelines for LLM training corpora: ingest, dedup, quality, versioned releases, "
    "lineage, WebDataset export on tiered storage.",
    epilog=FIRST_STEPS,
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


def _flags_show_no_value() -> None:
    """typer 0.29 prints every flag's type in --help (`--json <bool>`, `--full <bool>`), which reads as taking a
    value: `datahub runs --lake L --json true` then failed as "two lakes given ('true' ...)" (the word became the
    deprecated positional lake). A flag's help shows no type; options that take a value keep theirs."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # another typer: nothing printed a type to hide
        return

    def display_type_rich(self: TyperOption, *args: Any, **kwargs: Any) -> str | None:
        return None if self.is_flag else shown(self, *args, **kwargs)

    setattr(TyperOption, "display_type_rich", display_type_rich)


_flags_show_no_value()


def _register_commands() -> None:
    from datahub.cli import commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{info.name}").register(app)


_register_commands()


def main() -> None:
    _leave(_run())


# commands that stream a release after the lake: Arrow on malloc, freed batches returned (datahub/allocator.py)
POST_LAKE_COMMANDS = frozenset({"qa", "report", "export", "release", "tier", "lineage"})


def _run() -> int:
    """Run the command; its exit status."""
    try:
        if len(sys.argv) > 1 and sys.argv[1] in POST_LAKE_COMMANDS:
            use_system_allocator()
        status = app(standalone_mode=False)  # usage errors come here, printed as every other error is
        return status if isinstance(status, int) else 0
    except _NO_ARGS_IS_HELP as exc:  # `datahub tier`: its help is printed already
        return exc.exit_code
    except _click_errors.ClickException as exc:
        from datahub.cli.output import console, plain

        console(stderr=True).print(f"[bold red]error:[/] {plain(usage_error_text(exc))}", soft_wrap=True)
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except DatahubError as exc:
        from datahub.cli.output import console, plain

        # the message is escaped: `[a-z][a-z0-9_-]*` in an error is text, not Rich markup
        console(stderr=True).print(f"[bold red]error:[/] {plain(exc)}", soft_wrap=True)
        return 2
    except OSError as exc:
        # a path the user gave that cannot be made or read (--out on a file, a lake root under a missing mount,
        # no permission): a message that names it, not a traceback; an OSError that names no path (a connection
        # reset, a timeout) is not the user's path: its traceback stays
        if exc.filename is None or not exc.strerror or exc.errno not in _PATH_ERRNOS:
            raise
        from datahub.cli.output import console, plain

        console(stderr=True).print(f"[bold red]error:[/] {plain(os_error_text(exc))}", soft_wrap=True)
        return 2
    except SystemExit as exc:  # typer ends every command with one
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


def usage_error_text(exc: Exception) -> str:
    """A usage error (an unknown option, a missing argument, a value out of range) as one line with the command's
    --help: typer printed a 5-7 line box with the usage, unlike every other error (`error: ...`, one line) that a
    script or a person greps."""
    message = str(getattr(exc, "format_message", lambda: str(exc))())
    ctx = getattr(exc, "ctx", None)
    return message if ctx is None else f"{message} (see `{ctx.command_path} --help`)"


# what a path the user gave can be wrong with (an I/O error or a full disk in the middle of a run keeps its traceback)
_PATH_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM,
                          errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP})


def os_error_text(exc: OSError) -> str:
    """``exc`` (an OSError that names a path) as a person reads it: the path, what is wrong, and what to check."""
    paths = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
    return f"{paths}: {exc.strerror}; check that path and its permissions"


def _leave(status: int) -> None:
    """Exit with ``status`` once the command's output is flushed, skipping the interpreter's teardown.

    Native thread pools still alive at exit (pyarrow scans over s3fs, delta-rs's tokio runtime)
    can abort that teardown with "terminate called without an active exception" (delta-rs
    #2184), turning a successful command into exit status 134 for cron or Airflow. Engines are
    stopped and staging removed by the commands themselves before this point.
    """
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()

"""A script (cron, Airflow) branches on exit codes: the commands whose status carries a verdict say which in --help.
Before, `datahub qa --help` and `datahub lineage --help` did not mention that a failed suite or a lookup that finds
nothing exits 1 (README: "A lookup that finds nothing ... exits 1"); errors of the user's making exit 2."""

from __future__ import annotations

import pytest
from typer.main import get_command

from datahub.cli.main import app


def _help(*path: str) -> str:
    command = get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return " ".join((command.help or "").split())


@pytest.mark.parametrize("path, verdict", [
    (("qa",), "Exit 1 when a suite fails"),
    (("run",), "Exit 0 when the run succeeded or had nothing to do"),
    (("lineage",), "Exit 1 when nothing is found"),
    (("evalset", "check"), "Exit 1 when any does"),
])
def test_verdict_commands_state_their_exit_codes(path, verdict):
    text = _help(*path)
    assert verdict in text, text

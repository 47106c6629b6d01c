"""A usage error (a value out of range, an unknown option or command, a missing argument, an option value the
command refuses) is one `error:` line naming the command's --help, exit 2, like every other error. Before, typer
printed a 5-7 line box ("Usage: ... Try ... ╭─ Error ─╮ │ ... │ ╰─╯") that a script grepping `error:` missed."""

from __future__ import annotations

import pytest

from tests.cli.conftest import datahub


@pytest.mark.parametrize("args, message", [
    (["quarantine", "--lake", "LAKE", "--examples", "-1"],
     "error: Invalid value for '--examples': Input should be greater than or equal to 0 (see `"),
    (["report", "--lake", "LAKE", "--outt", "x"], "error: No such option: --outt (Possible options: --out)"),
    (["reprot"], "error: No such command 'reprot'. Did you mean 'report'"),
    (["schedule", "render", "--target", "cron"], "error: Missing argument 'jobs'."),
    (["lineage", "--lake", "LAKE"], "error: Invalid value: give a SAMPLE_ID or --source URI (one of them)"),
])
def test_a_usage_error_is_one_line_naming_the_help(small_lake, args, message):
    out = datahub(*[str(small_lake) if a == "LAKE" else a for a in args])
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(message), out.stderr
    assert out.stderr.rstrip().endswith(" --help`)") and "╭" not in out.stderr and out.stdout == "", out.stderr


def test_help_version_and_a_group_without_command_are_unchanged():
    assert datahub("runs", "--help").returncode == 0
    version = datahub("--version")
    assert version.returncode == 0 and version.stdout.startswith("datahub ")
    group = datahub("tier")  # no subcommand: its help, exit 2 as before
    assert group.returncode == 2 and "plan" in group.stdout and "apply" in group.stdout, group.stdout + group.stderr

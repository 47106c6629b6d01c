"""Every command's --help ends with command lines to copy (a new user's first question after "what does it do" is
"how do I call it"); before, no --help showed one. Each example is parsed by the command itself, so an example
cannot name an option that does not exist or miss a required one."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from typer.main import get_command

from datahub.cli.main import app
from tests.cli.conftest import datahub

COMMANDS = [("run",), ("runs",), ("schedule", "render"), ("tier", "plan"), ("tier", "apply"), ("tier", "touch"),
            ("tier", "remove"), ("quarantine",), ("lineage",), ("report",), ("inspect",), ("export",)]


def _command(path: tuple[str, ...]) -> Any:
    command = get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _examples(command: Any) -> list[str]:
    epilog = command.epilog or ""
    assert epilog.startswith("Examples"), f"no Examples: block in {command.name}'s help"
    examples: list[str] = []
    continued = False
    for line in epilog.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("#"):  # a comment says what the next example does
            continue
        if continued:
            examples[-1] += " " + line.removesuffix("\\").strip()
        else:
            examples.append(line.removesuffix("\\").strip())
        continued = line.endswith("\\")  # a long example goes on on the next line, as in a shell
    return examples


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_shows_examples_its_own_parser_accepts(path):
    command = _command(path)
    examples = _examples(command)
    assert examples, path
    for example in examples:
        words = shlex.split(example)
        assert words[:1 + len(path)] == ["datahub", *path], example
        args = words[1 + len(path):]
        assert args, f"{example}: an example with no arguments shows nothing"
        with command.make_context(" ".join(path), args, resilient_parsing=False):  # raises on an unknown option
            pass


def test_the_top_level_help_shows_a_first_session_of_commands_that_parse():
    """`datahub --help` listed the commands alphabetically with no way in; now the README's first session."""
    examples = _examples(get_command(app))
    assert [e.split()[1] for e in examples][:2] == ["run", "runs"] and len(examples) >= 5, examples
    for example in examples:
        words = shlex.split(example)[1:]
        command = get_command(app)
        while hasattr(command, "commands"):  # a group: the subcommand path, then its arguments
            command, words = command.commands[words[0]], words[1:]
        with command.make_context(command.name or "", words):
            pass


def test_the_examples_print_in_help():
    out = datahub("export", "--help")
    assert out.returncode == 0, out.stderr
    assert "Examples:" in out.stdout and "datahub export corpus-v1 --lake lake/ --tier cfs --storage storage.yaml" in out.stdout, out.stdout


@pytest.mark.parametrize("path", [("runs",), ("run",), ("export",), ("release", "create")], ids=" ".join)
def test_a_flag_is_not_shown_as_taking_a_value(path):
    """typer printed `--json <bool>`; `datahub runs --lake L --json true` then failed as "two lakes given ('true')"."""
    out = datahub(*path, "--help")
    assert out.returncode == 0, out.stderr
    assert "--json" in out.stdout and "<bool>" not in out.stdout, out.stdout
    assert "<str>" in out.stdout  # an option that takes a value still says what

"""The README's command examples, as a new user copies them, and the commands `make demo` runs: every `datahub ...`
line of a ```bash block (or of the Makefile) names a real command, only options that command has, every option it
requires, and no deprecated positional lake."""

from __future__ import annotations

import re
from pathlib import Path

from typer.main import get_command

from datahub.cli.main import app

README = Path(__file__).resolve().parents[2] / "README.md"
MAKEFILE = README.parent / "Makefile"
# commands whose first positional argument is the lake, deprecated for --lake (it prints a note on every use)
DEPRECATED_POSITIONAL_LAKE = {"inspect", "runs", "qa", "report"}


def readme_command_lines() -> list[str]:
    """Each `datahub ...` command of the README's bash blocks (continuations joined, comments and `;` split off)."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split(" ; "):
                command = part.split("#")[0].strip()
                if command.startswith("datahub "):
                    lines.append(command)
    return lines


def makefile_command_lines() -> list[str]:
    """Each `$(BIN)/datahub ...` command the Makefile runs (`make demo` is a new user's first command)."""
    return [line.strip().split("#")[0].strip().removeprefix("$(BIN)/") for line in MAKEFILE.read_text().splitlines()
            if line.strip().startswith("$(BIN)/datahub ")]


def problems(line: str) -> list[str]:
    command = get_command(app)
    words = line.split()[1:]
    while words and words[0] in getattr(command, "commands", {}):
        command = command.commands[words.pop(0)]  # type: ignore[attr-defined]
    if getattr(command, "commands", None):
        if words and "|" in words[0]:
            return []  # `datahub release list|show ...`: several subcommands named at once
        return [f"no such command: {' '.join(line.split()[:3])}"]
    options = {name for param in command.params for name in (*param.opts, *getattr(param, "secondary_opts", ()))}
    found = []
    if line.split()[1] in DEPRECATED_POSITIONAL_LAKE and "--lake" not in line:
        found.append("deprecated positional LAKE: use --lake")
    for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line)) - options):
        found.append(f"unknown option {flag}")
    for param in command.params:
        if param.required and param.opts[0].startswith("--") and not any(name in line for name in param.opts):
            found.append(f"missing required {param.opts[0]}")
    return found


def test_readme_bash_commands_match_the_cli():
    lines = readme_command_lines()
    assert len(lines) > 20  # the README's release, lineage, export, tier, qa and evalset examples
    stale = {line: found for line in lines if (found := problems(line))}
    assert not stale, stale


def test_makefile_demo_commands_match_the_cli():
    lines = makefile_command_lines()
    assert any(line.startswith("datahub release create") for line in lines)
    stale = {line: found for line in lines if (found := problems(line))}
    assert not stale, stale


def test_the_check_finds_a_stale_example():
    assert problems("datahub release promote corpus-v2 --channel stable") == ["missing required --lake"]
    assert problems("datahub tier plan --lake l/ --storage s.yaml --dry-run") == ["unknown option --dry-run"]
    assert problems("datahub releases list --lake l/") == ["no such command: datahub releases list"]
    assert problems("datahub inspect lake/demo") == ["deprecated positional LAKE: use --lake"]
    assert problems("datahub inspect --lake lake/demo samples") == []

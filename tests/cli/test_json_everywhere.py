"""Every command that prints a result takes --json (a script in Airflow or cron parses it, not the text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.main import get_command

from datahub.cli.main import app
from tests.cli.conftest import datahub


def commands(command=None, path: tuple[str, ...] = ()):
    command = command or get_command(app)
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield " ".join(path), command
        return
    for name, sub in subcommands.items():
        yield from commands(sub, (*path, name))


def test_every_command_has_json():
    missing = [name for name, command in commands()
               if "--json" not in {opt for param in command.params for opt in param.opts}]
    assert not missing, missing


@pytest.fixture(scope="module")
def lake_with_a_release(small_lake) -> Path:
    from datahub.lake import Lake
    from datahub.release.create import create_release

    create_release(Lake(small_lake), "r1")
    create_release(Lake(small_lake), "r2")
    return small_lake


def test_channel_and_event_commands_print_json(lake_with_a_release):
    lake = str(lake_with_a_release)

    def run_json(*args: str) -> object:
        out = datahub(*args, "--lake", lake, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert run_json("release", "promote", "r1", "--channel", "beta") == {"channel": "beta", "release": "r1"}
    assert run_json("release", "promote", "r2", "--channel", "beta") == {"channel": "beta", "release": "r2"}
    assert run_json("release", "rollback", "--channel", "beta") == {"channel": "beta", "release": "r1"}
    assert run_json("release", "archive", "r2") == {"release": "r2", "state": "archived", "changed": True}
    assert run_json("release", "archive", "r2") == {"release": "r2", "state": "archived", "changed": False}
    assert run_json("tier", "touch", "r1") == {"release": "r1", "recorded": True}


def test_every_lake_option_says_it_takes_a_lake_yaml():
    """README: every command takes the lake as --lake ROOT_OR_YAML (an S3 lake's keys live in the YAML). The
    release commands' and lineage's --help said only "Lake root: a path or s3://bucket/prefix", so a user with an S3
    lake did not learn there that the YAML works; schedule render's did not say it ships the YAML to the pod."""
    missing = [name for name, command in commands() for param in command.params
               if "--lake" in param.opts and "YAML" not in (param.help or "")]
    assert not missing, missing

"""An empty value is what a script passes for an unset variable (`--lake "$LAKE"`): it is refused, naming the option.
Before, `quarantine --lake ""` and `tier plan --lake ""` read the current directory as the lake ("nothing
quarantined", "nothing to move", exit 0), `run JOB --lake ""` ran into the spec's own lake, `report --out ""` wrote
index.html and its plots into the current directory, and `runs --job ""` listed every job's runs."""

from __future__ import annotations

import pytest

from tests.cli.conftest import REPO, datahub
from tests.cli.test_clean_errors import assert_clean_error


@pytest.mark.parametrize("args, option", [
    (["quarantine", "--lake", ""], "--lake"),
    (["lineage", "0" * 32, "--lake", ""], "--lake"),
    (["tier", "plan", "--lake", "", "--storage", "STORAGE"], "--lake"),
    (["export", "r1", "--lake", "", "--tier", "cfs", "--storage", "STORAGE"], "--lake"),
    (["run", "JOB", "--lake", "", "--check"], "--lake"),
    (["run", "JOB", "--engine", " ", "--check"], "--engine"),
    (["report", "--lake", "LAKE", "--out", ""], "--out"),
    (["schedule", "render", "JOB", "--target", "cron", "--out", ""], "--out"),
    (["runs", "--lake", "LAKE", "--job", ""], "--job"),
    (["quarantine", "--lake", "LAKE", "--run", ""], "--run"),
    (["quarantine", "--lake", "LAKE", "--reason", ""], "--reason"),
])
def test_an_empty_value_is_refused_naming_the_option(small_lake, tmp_path, args, option):
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    work = tmp_path / "cwd"  # the directory the command runs in: nothing may be read from or written to it
    work.mkdir()
    given = {"LAKE": str(small_lake), "STORAGE": str(storage), "JOB": str(REPO / "jobs" / "chat-demo.yaml")}
    args = [given.get(a, a) for a in args]
    out = datahub(*args, cwd=work)
    assert_clean_error(out, f"{option} is empty (an unset variable?); give ")
    assert list(work.iterdir()) == []

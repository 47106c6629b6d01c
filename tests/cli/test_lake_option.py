"""`--lake` takes a lake root or a lake YAML (root + storage_options, ${VAR} expanded, or a job spec's lake:)."""

from __future__ import annotations

import pytest

from datahub.cli.lake_option import open_lake
from datahub.errors import SpecError
from tests.export.helpers import make_lake, samples_table


def test_a_root_is_a_lake_and_a_yaml_file_carries_storage_options(tmp_path, monkeypatch) -> None:
    make_lake(tmp_path / "lake", 3)
    plain = open_lake(str(tmp_path / "lake"))
    assert plain.root == str(tmp_path / "lake") and plain.storage_options == {}

    monkeypatch.setenv("DH_TEST_LAKE_SECRET", "s3cr3t")
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'lake'}\nstorage_options:\n  AWS_SECRET_ACCESS_KEY: ${{DH_TEST_LAKE_SECRET}}\n"
                         "  AWS_ALLOW_HTTP: true\n  timeout: 30\n  AWS_REGION: ${DH_TEST_UNSET:-eu-west-1}\n")
    lake = open_lake(str(lake_file))
    assert lake.root == str(tmp_path / "lake")
    assert lake.storage_options == {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ALLOW_HTTP": "true", "timeout": "30",
                                    "AWS_REGION": "eu-west-1"}
    assert lake.read("samples").num_rows == 3
    assert open_lake(str(lake_file), storage_options={"timeout": "5"}).storage_options["timeout"] == "5"

    job = tmp_path / "job.yaml"  # a job spec names its lake the same way
    job.write_text(f"name: j\nlake:\n  root: {tmp_path / 'lake'}\n  storage_options: {{AWS_REGION: us-east-1}}\n"
                   "inputs: [{uri: x.jsonl}]\ngraph: {}\n")
    assert open_lake(str(job)).storage_options == {"AWS_REGION": "us-east-1"}


def test_lake_file_errors_name_the_file_and_field(tmp_path) -> None:
    with pytest.raises(SpecError, match=r"missing\.yaml: lake file not found"):
        open_lake(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("root: /x\nstorage_option: {}\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: storage_option: unknown field"):
        open_lake(str(bad))
    unset = tmp_path / "unset.yaml"
    unset.write_text("root: /x\nstorage_options: {AWS_SECRET_ACCESS_KEY: '${DH_TEST_NEVER_SET}'}\n")
    with pytest.raises(SpecError, match=r"unset\.yaml: storage_options\.AWS_SECRET_ACCESS_KEY: environment variable "
                                        "DH_TEST_NEVER_SET is not set"):
        open_lake(str(unset))
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nlake: {root: '${DH_TEST_NEVER_SET}'}\n")
    with pytest.raises(SpecError, match=r"job\.yaml: lake\.root: environment variable DH_TEST_NEVER_SET is not set"):
        open_lake(str(job))
    storage = tmp_path / "storage.yaml"
    storage.write_text("tiers:\n  cfs: {kind: cfs, path: /x}\n")
    with pytest.raises(SpecError, match=r"storage\.yaml: a storage config \(tiers:\), not a lake; give it as --storage"):
        open_lake(str(storage))
    listed = tmp_path / "list.yaml"
    listed.write_text("- root: /x\n")
    with pytest.raises(SpecError, match=r"list\.yaml: expected a mapping with root:"):
        open_lake(str(listed))


def test_every_lake_command_accepts_a_lake_file(tmp_path) -> None:
    """inspect, runs, lineage, release and tier open the lake through the same function."""
    import json

    from typer.testing import CliRunner

    from datahub.cli.main import app

    make_lake(tmp_path / "lake", 4)
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'lake'}\n")
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, f"{args}: {result.output} {result.exception!r}"
        return result.stdout

    assert json.loads(ok("inspect", str(lake_file), "--json"))["tables"]["samples"]["rows"] == 4
    assert json.loads(ok("runs", str(lake_file), "--json")) == []
    ok("release", "create", "r1", "--lake", str(lake_file))
    assert [r["name"] for r in json.loads(ok("release", "list", "--lake", str(lake_file), "--json"))] == ["r1"]
    sample_id = samples_table(1)["sample_id"][0].as_py()
    story = ok("lineage", sample_id, "--lake", str(lake_file), "--json")
    assert sample_id in story and "r1" in story  # released in r1


def test_hints_in_messages_name_the_lake_file_a_command_was_given(tmp_path) -> None:
    """A pasted hint must reach the same lake: with a lake YAML it names the file (which carries the storage
    options), not the bare root."""
    from typer.testing import CliRunner

    from datahub.cli.main import app
    from datahub.release.qa_gate import qa_command

    make_lake(tmp_path / "lake", 2)
    lake_file = tmp_path / "lake.yaml"
    lake_file.write_text(f"root: {tmp_path / 'lake'}\nstorage_options: {{timeout: '30'}}\n")
    assert open_lake(str(lake_file)).ref == str(lake_file)
    assert open_lake(str(tmp_path / "lake")).ref == str(tmp_path / "lake")
    assert qa_command(open_lake(str(lake_file)), table="samples") == f"datahub qa --lake {lake_file} --table samples"
    missing = CliRunner().invoke(app, ["release", "show", "nope", "--lake", str(lake_file)])
    assert missing.exit_code != 0  # the app raises; datahub's main() prints the message
    assert f"datahub release list --lake {lake_file})" in missing.output + str(missing.exception)

"""release.redact (take-downs across releases) and release.channels (movable pointers)."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from datahub.cli.main import app
from datahub.errors import ReleaseError
from datahub.lake import Lake
from datahub.release import (channel_history, channel_of, create_release, get_release, promote, redact, redacted_ids,
                             rollback)
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples


def test_redact_across_two_releases(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["keep me", "private phone number 555", "another one"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    add_samples(lake, ["newer doc", "book text"], "book.txt", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r2")
    secret = sample_id_of("private phone number 555")

    r3 = redact(lake, "r3", source="r2", sample_ids=[secret], reason="PII: phone number")
    assert r3.kind == "redact" and r3.parents == ("r2",) and r3.row_count == 4
    assert r3.details["contained_in"] == {"r1": 1, "r2": 1}
    assert r3.details["reason"] == "PII: phone number" and r3.details["removed"] == 1
    assert r3.details["removed_ids_table"] == "redacted_samples" and "removed_ids" not in r3.details
    assert redacted_ids(lake, "r3").to_pylist() == [secret]
    assert secret not in lake.read(r3.table, version=r3.version).column("sample_id").to_pylist()
    # old releases stay readable (Delta time travel) and unchanged
    for name in ("r1", "r2"):
        old = get_release(lake, name)
        assert secret in lake.read(old.table, version=old.version).column("sample_id").to_pylist()
    lineage = lake.read("lineage")
    events = lineage.filter(pc.equal(lineage.column("sample_id"), secret)).to_pylist()
    drop = [e for e in events if e["action"] == "dropped"]
    assert len(drop) == 1 and drop[0]["reason"] == "redacted: PII: phone number" and drop[0]["op"] == "release.redact@1"
    assert sorted(e["ref"] for e in events if e["action"] == "released") == ["r1", "r2"]

    # by source: every sample of the file; the new release (r3) is listed too
    r4 = redact(lake, "r4", source="r3", source_uri="book.txt", reason="copyright take-down")
    assert r4.row_count == 2 and r4.details["contained_in"] == {"r2": 2, "r3": 2}
    with pytest.raises(ReleaseError, match="holds none"):
        redact(lake, "r5", source="r4", sample_ids=[secret], reason="again")
    with pytest.raises(ReleaseError, match="--reason"):
        redact(lake, "r5", source="r4", sample_ids=[secret], reason=" ")


def test_channels_move_and_roll_back(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["one"], "a", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    v_two = add_samples(lake, ["two"], "a", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r2")
    assert channel_of(lake, "stable") is None
    promote(lake, "r1", channel="stable")
    promote(lake, "r2", channel="stable")
    promote(lake, "r1", channel="canary")
    assert channel_of(lake, "stable").name == "r2"
    assert get_release(lake, "r1").channels == ("canary",)
    assert rollback(lake, channel="stable").name == "r1"
    assert channel_of(lake, "stable").name == "r1"
    assert get_release(lake, "r1").channels == ("canary", "stable")
    with pytest.raises(ReleaseError, match="cannot roll back"):
        rollback(lake, channel="stable")
    with pytest.raises(ReleaseError, match="no release"):
        promote(lake, "r9", channel="stable")
    with pytest.raises(ReleaseError) as bad_channel:  # the release name's reason (a table directory) is not a channel's
        promote(lake, "r1", channel="Stable Channel")
    assert str(bad_channel.value) == ("channel name 'Stable Channel': use 1-128 letters, digits, '_', '.' or '-', "
                                      "starting with a letter or digit")
    assert [e.action for e in channel_history(lake, "stable")] == ["promote", "promote", "rollback"]
    assert get_release(lake, "r2").version == v_two and get_release(lake, "r2").row_count == 2  # releases do not move


def test_cli_release_commands(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["one", "two"], "a", run_id="job-aaaaaaaaaaaa")
    runner = CliRunner()
    result = runner.invoke(app, ["release", "create", "cli-1", "--lake", lake.root])
    assert result.exit_code == 0, result.output
    assert "no QA results" in result.output
    shown = runner.invoke(app, ["release", "show", "cli-1", "--lake", lake.root, "--json"])
    import json

    data = json.loads(shown.output)
    assert data["name"] == "cli-1" and data["row_count"] == 2 and data["digest"].startswith("sum128:")
    again = runner.invoke(app, ["release", "create", "cli-1", "--lake", lake.root])
    assert isinstance(again.exception, ReleaseError)
    sample = sample_id_of("one")
    red = runner.invoke(app, ["release", "redact", "cli-2", "--from", "cli-1", "--sample", sample,
                              "--reason", "test", "--lake", lake.root])
    assert red.exit_code == 0, red.output
    assert "cli-1: 1" in red.output
    diff = runner.invoke(app, ["release", "diff", "cli-1", "cli-2", "--lake", lake.root, "--json", "--ids"])
    assert json.loads(diff.output)["removed_ids"] == [sample]
    assert runner.invoke(app, ["release", "promote", "cli-2", "--lake", lake.root]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["release", "list", "--lake", lake.root, "--json"]).output)
    assert [(r["name"], r["channels"]) for r in listed] == [("cli-1", []), ("cli-2", ["stable"])]


def test_cli_redact_ids_file_and_rollback_stable(tmp_path):
    import json

    lake = Lake(tmp_path / "lake")
    texts = ["public doc one", "leaked email a@b.c", "public doc two", "leaked phone 555 0100"]
    add_samples(lake, texts[:2], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "v1")
    add_samples(lake, texts[2:], "b.jsonl", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "v2")
    leaked = [sample_id_of(texts[1]), sample_id_of(texts[3])]
    ids_file = tmp_path / "takedown.txt"
    ids_file.write_text(f"# PII take-down #42\n{leaked[0]}\n\n{leaked[1]}  # the phone number\n")
    runner = CliRunner()

    out = runner.invoke(app, ["release", "redact", "v3", "--from", "v2", "--ids-file", str(ids_file),
                              "--reason", "PII take-down #42", "--lake", lake.root, "--json"])
    assert out.exit_code == 0, out.output
    v3 = json.loads(out.output)
    assert v3["row_count"] == 2 and v3["parents"] == ["v2"]
    assert v3["details"]["removed"] == 2 and v3["details"]["requested_ids"] == 2
    assert redacted_ids(lake, "v3").to_pylist() == sorted(leaked)
    assert v3["details"]["contained_in"] == {"v1": 1, "v2": 2}
    kept = lake.read(v3["table"], version=v3["version"]).column("sample_id").to_pylist()
    assert sorted(kept) == sorted([sample_id_of(texts[0]), sample_id_of(texts[2])])
    missing = runner.invoke(app, ["release", "redact", "v4", "--from", "v2", "--ids-file", str(tmp_path / "nope.txt"),
                                  "--reason", "x", "--lake", lake.root])
    assert isinstance(missing.exception, ReleaseError) and "nope.txt: cannot read it" in str(missing.exception)

    for name in ("v1", "v2", "v3"):
        assert runner.invoke(app, ["release", "promote", name, "--channel", "stable", "--lake", lake.root]).exit_code == 0
    back = runner.invoke(app, ["release", "rollback", "--channel", "stable", "--lake", lake.root])
    assert back.exit_code == 0, back.output
    assert "stable" in back.output and "v2" in back.output
    assert channel_of(lake, "stable").name == "v2"
    assert runner.invoke(app, ["release", "rollback", "--channel", "stable", "--lake", lake.root]).exit_code == 0
    assert channel_of(lake, "stable").name == "v1"
    last = runner.invoke(app, ["release", "rollback", "--channel", "stable", "--lake", lake.root])
    assert isinstance(last.exception, ReleaseError) and "no earlier release than 'v1'" in str(last.exception)
    shown = json.loads(runner.invoke(app, ["release", "show", "v1", "--lake", lake.root, "--json"]).output)
    assert shown["channels"] == ["stable"]
    assert [e.action for e in channel_history(lake, "stable")] == ["promote"] * 3 + ["rollback"] * 2


def test_create_after_redact_leaves_taken_down_samples_out(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["keep me", "private phone number 555", "another one"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    secret = sample_id_of("private phone number 555")
    redact(lake, "r1-r", source="r1", sample_ids=[secret], reason="PII: phone number")
    add_samples(lake, ["book text", "book text two"], "book.txt", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "r2")
    redact(lake, "r2-r", source="r2", source_uri="book.txt", reason="copyright take-down")
    # a later run adds more of the taken-down file and a new doc; the samples table still holds the secret
    add_samples(lake, ["book text three", "fresh doc"], "book.txt", run_id="job-cccccccccccc")
    add_samples(lake, ["fresh doc two"], "b.jsonl", run_id="job-dddddddddddd")
    assert secret in lake.read("samples").column("sample_id").to_pylist()

    r3 = create_release(lake, "r3")
    rows = lake.read(r3.table, version=r3.version)
    assert r3.table == "release_r3" and r3.row_count == rows.num_rows == 3
    assert sorted(rows.column("text").to_pylist()) == ["another one", "fresh doc two", "keep me"]
    assert r3.details["redacted_excluded"] == {"rows": 5, "by": ["r1-r", "r2-r"]}
    assert r3.details["from_table"] == "samples" and r3.run_ids  # the source table's runs, not the copy's
    lineage = lake.read("lineage")
    events = lineage.filter(pc.equal(lineage.column("sample_id"), secret)).to_pylist()
    mine = [e for e in events if e["run_id"] == "release/r3"]
    assert [(e["action"], e["reason"]) for e in mine] == [
        ("dropped", "redacted: PII: phone number (release redact r1-r)")]
    released = lineage.filter(pc.equal(lineage.column("ref"), "r3")).column("sample_id").to_pylist()
    assert sorted(released) == sorted(rows.column("sample_id").to_pylist())

    # nothing taken down in the version: the release freezes the table itself, as before
    other = Lake(tmp_path / "other")
    add_samples(other, ["x doc", "y doc"], "a.jsonl", run_id="job-eeeeeeeeeeee")
    r = create_release(other, "o1")
    assert r.table == "samples" and "redacted_excluded" not in r.details


def test_redact_records_written_before_redacted_samples_still_take_samples_down(tmp_path):
    """A redact record of the older format holds its ids inline (``details["removed_ids"]``): it is still read,
    by ``redacted_ids`` and by a later release create, next to records that point at ``redacted_samples``."""
    import json
    import shutil

    import pyarrow as pa

    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["keep me", "private phone number 555", "leaked mail a@b.c"], "a.jsonl",
                run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    old_secret, new_secret = sample_id_of("private phone number 555"), sample_id_of("leaked mail a@b.c")
    redact(lake, "old-r", source="r1", sample_ids=[old_secret], reason="PII: phone")
    # rewrite old-r's record as an older datahub wrote it: the ids inline, nothing in redacted_samples
    rows = lake.read("releases")
    details = [json.loads(d) for d in rows.column("details").to_pylist()]
    for name, entry in zip(rows.column("name").to_pylist(), details):
        if name == "old-r":
            entry.pop("removed_ids_table")
            entry["removed_ids"] = [old_secret]
    rows = rows.set_column(rows.schema.get_field_index("details"), "details",
                           pa.array([json.dumps(d) for d in details], pa.string()))
    lake.commit("releases", rows, txn="test/old-format", mode="overwrite")
    shutil.rmtree(tmp_path / "lake" / "redacted_samples")
    redact(lake, "new-r", source="old-r", sample_ids=[new_secret], reason="PII: mail")

    assert redacted_ids(lake, "old-r").to_pylist() == [old_secret]
    assert redacted_ids(lake, "new-r").to_pylist() == [new_secret]
    with pytest.raises(ReleaseError, match="not a redact"):
        redacted_ids(lake, "r1")
    r2 = create_release(lake, "r2")
    assert lake.read(r2.table, version=r2.version).column("text").to_pylist() == ["keep me"]
    assert r2.details["redacted_excluded"] == {"rows": 2, "by": ["new-r", "old-r"]}


def test_cli_redact_of_an_ids_file_with_no_ids_names_the_file_and_exits_2(tmp_path):
    """An --ids-file holding only comments and blank lines: the error says so (not 'needs what to remove: ...
    --ids-file F', which --ids-file was), names the file and what a line should hold; exit status 2."""
    import os
    import subprocess
    import sys

    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["public doc one", "public doc two"], "a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "v1")
    empty = tmp_path / "EMPTY.txt"
    empty.write_text("# take-down #7: ids to follow\n\n   \n")
    done = subprocess.run([sys.executable, "-m", "datahub.cli.main", "release", "redact", "v2", "--from", "v1",
                           "--ids-file", str(empty), "--reason", "take-down #7", "--lake", lake.root],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert done.returncode == 2, done.stderr
    error = " ".join(done.stderr.split())
    assert "needs what to remove" not in error
    assert f"{empty}" in error and "holds no sample ids" in error and "one sample id per line" in error
    with pytest.raises(ReleaseError, match="holds no sample ids"):
        redact(lake, "v2", source="v1", ids_files=[str(empty)], reason="take-down #7")

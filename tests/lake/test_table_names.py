"""A mistyped table name (``datahub inspect --lake L sample``, ``qa --table sample``) said only "run a job that writes
it first", though the lake had the table under its right name: now the lake's tables are listed with a did-you-mean;
an empty lake keeps the run-a-job hint."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from datahub.errors import LakeError
from datahub.lake import Lake
from tests.release.helpers import add_samples


def _lake(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    add_samples(lake, ["a small document about rivers and the valley towns"], "s3://b/a.jsonl", run_id="job-aaaaaaaaaaaa")
    lake.commit("lineage_notes", pa.table({"x": [1]}), txn="t")
    return lake


def test_a_mistyped_table_lists_the_tables_and_the_closest_name(tmp_path):
    lake = _lake(tmp_path)
    with pytest.raises(LakeError) as missing:
        lake.table("sample")
    message = str(missing.value)
    assert message == (f"{lake.table_uri('sample')}: no Delta table 'sample' in lake {lake.root}; did you mean "
                       f"'samples'? (its tables: lineage_notes, samples; datahub inspect --lake {lake.ref})"), message
    assert "datahub run" not in message


def test_an_empty_lake_keeps_the_run_a_job_hint(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(LakeError, match=r"no Delta table 'samples' in lake .*; run a job that writes it first "
                                        r"\(datahub run JOB.yaml\)$"):
        lake.table("samples")


def test_inspect_and_qa_name_the_table_they_meant(tmp_path):
    lake = _lake(tmp_path)

    def datahub(*args):
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True)

    for args in (("inspect", "--lake", lake.root, "sample"), ("qa", "--lake", lake.root, "--table", "sample")):
        result = datahub(*args)
        err = " ".join(result.stderr.split())
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "no Delta table 'sample'" in err and "did you mean 'samples'?" in err, (args, err)
        assert "Traceback" not in result.stderr


def test_the_commands_named_in_the_errors_are_quoted_for_a_lake_path_with_spaces(tmp_path):
    # the hint is meant to be pasted into a shell: an unquoted path with a space ran `inspect` on a non-lake
    lake = Lake(tmp_path / "night lake")
    add_samples(lake, ["a small document about rivers and the valley towns"], "s3://b/a.jsonl", run_id="job-aaaaaaaaaaaa")
    quoted = f"datahub inspect --lake '{lake.ref}'"
    with pytest.raises(LakeError) as missing:
        lake.table("sample")
    assert str(missing.value).endswith(f"{quoted})"), str(missing.value)
    with pytest.raises(LakeError) as too_new:
        lake.read("samples", version=99)
    assert f"({quoted} samples shows it)" in str(too_new.value), str(too_new.value)

"""`release list/show --json` and `evalset add/list --json` print their date-times as every --json does (ISO 8601 UTC
with 'Z', print_json): their as_dict formatted the string itself with isoformat's '+00:00' (7ac478c's note)."""

from __future__ import annotations

import json
import re

from datahub.lake import Lake
from datahub.release import create_release
from tests.cli.test_evalset_check import datahub
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def test_release_and_evalset_json_date_times_end_in_z(tmp_path):
    lake = Lake(tmp_path / "lake")
    added = datahub("evalset", "add", "bench", str(write_evalset(tmp_path / "bench.jsonl")), "--lake", lake.root,
                    "--json")
    assert added.returncode == 0, added.stderr
    add_samples(lake, ["a document about rivers, mountains and the long history of the valley towns"],
                "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r")
    listed = datahub("evalset", "list", "--lake", lake.root, "--json")
    shown = datahub("release", "show", "r", "--lake", lake.root, "--json")
    releases = datahub("release", "list", "--lake", lake.root, "--json")
    assert listed.returncode == shown.returncode == releases.returncode == 0, listed.stderr + shown.stderr
    times = [json.loads(added.stdout)["added"], json.loads(listed.stdout)[0]["added"],
             json.loads(shown.stdout)["created"], json.loads(releases.stdout)[0]["created"]]
    assert all(ISO_UTC.match(t) for t in times), times

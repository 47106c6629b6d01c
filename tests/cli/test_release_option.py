"""`--release NAME` on the commands that read a table version (report, qa; evalset check has it too): a data
engineer reports on, or checks, the release they ship, and a merged or redacted release lives in a table of its
own (release_NAME) that the user had to find with `release show`. Before, `report --release` was "No such option"."""

from __future__ import annotations

import json

from tests.cli.conftest import datahub


def test_report_and_qa_take_a_release(small_lake, tmp_path):
    from datahub.lake import Lake
    from datahub.release import merge_releases
    from datahub.release.create import create_release

    create_release(Lake(small_lake), "r1")
    merge_releases(Lake(small_lake), "mix", sources=["r1"])
    lake = str(small_lake)

    report = datahub("report", "--lake", lake, "--release", "mix", "--out", str(tmp_path / "report"), "--json")
    assert report.returncode == 0, report.stderr
    assert "release_mix" in (tmp_path / "report" / "index.html").read_text()
    qa = datahub("qa", "--lake", lake, "--release", "mix", "--no-record", "--json")
    assert qa.returncode == 0, qa.stderr
    (result,) = json.loads(qa.stdout)["results"]
    assert (result["table"], result["table_version"]) == ("release_mix", 1)

    typo = datahub("qa", "--lake", lake, "--release", "mx")
    assert typo.returncode == 2 and "no release 'mx'" in typo.stderr and "did you mean 'mix'" in typo.stderr, typo.stderr
    both = datahub("report", "--lake", lake, "--release", "r1", "--version", "1", "--out", str(tmp_path / "r2"))
    assert both.returncode == 2 and "--release r1 already fixes the table and version" in both.stderr, both.stderr

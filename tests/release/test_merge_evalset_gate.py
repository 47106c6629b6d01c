"""``release merge`` runs the eval-set gate of ``release create`` on each --from release: eval sets registered after
an input release was created made a merge that leaked them (exit 0; ``evalset check --release`` found them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.release import create_release, get_release, list_releases, merge_releases
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import item_text, write_evalset
from tests.release.helpers import add_samples
from tests.release.test_crash_rerun import kill_before_record  # noqa: F401  (fixture)

CLEAN = [f"an ordinary training document number {i} about gardening, tools, soil and the weather in spring" for i in range(4)]
LEAKED = ["Forum post: " + item_text("q2").upper() + " thanks!", "Quiz answers. " + item_text("q3")]
OTHER = [f"a second corpus document number {i} about harbours, ships and the tides of the northern sea" for i in range(3)]


def _lake(tmp_path) -> Lake:
    """Releases ``clean`` and ``leaky`` created before the eval set ``bench`` was registered (so create let them
    through), then ``bench`` added."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    return lake


def test_a_merge_of_a_contaminated_release_is_refused_before_anything_is_written(tmp_path):
    lake = _lake(tmp_path)
    leaked_ids = sorted(sample_id_of(t) for t in LEAKED)
    with pytest.raises(ReleaseError) as refused:
        merge_releases(lake, "mix", sources=["clean", "leaky"])
    message = str(refused.value)
    version = get_release(lake, "leaky").version
    assert message.startswith(f"release 'mix' refused: --from release 'leaky': 2 sample(s) of samples v{version} "
                              "overlap eval sets [bench@1: 2 sample(s)]"), message
    assert all(sample_id in message for sample_id in leaked_ids), message
    assert "clean" not in message.split("\n")[0].replace("'leaky'", "")  # only the contaminated input is named
    assert '--allow-contamination "REASON"' in message
    assert [r.name for r in list_releases(lake)] == ["clean", "leaky"]
    assert not lake.exists("release_mix")


def test_allowed_contamination_of_a_merge_is_recorded_as_create_records_it(tmp_path):
    lake = _lake(tmp_path)
    with pytest.raises(ReleaseError, match="needs a reason"):
        merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="  ")
    release = merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="bench is a public dev split")
    assert release.row_count == 9
    recorded = get_release(lake, "mix").details["contamination"]
    assert recorded["allowed"] == "bench is a public dev split"
    assert recorded["by_evalset"] == {"bench@1": 2} and recorded["contaminated"] == 2
    assert recorded["evalsets"] == ["bench@1"] and recorded["rows_checked"] == 9
    assert {name: c["contaminated"] for name, c in recorded["releases"].items()} == {"clean": 0, "leaky": 2}


def test_a_clean_merge_records_the_check(tmp_path):
    lake = _lake(tmp_path)
    release = merge_releases(lake, "mix", sources=["clean"])
    recorded = release.details["contamination"]
    assert recorded["allowed"] is None and recorded["contaminated"] == 0 and recorded["rows_checked"] == 3


def test_cli_merge_refuses_then_allows_and_redact_help_says_it_is_not_rechecked(tmp_path):
    lake = _lake(tmp_path)

    def datahub(*args):
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], capture_output=True, text=True)

    refused = datahub("release", "merge", "mix", "--from", "clean", "--from", "leaky", "--lake", lake.root)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    err = " ".join(refused.stderr.split())
    assert "--from release 'leaky'" in err and "bench@1: 2 sample(s)" in err, err
    assert sample_id_of(LEAKED[0]) in err and "--allow-contamination" in err, err
    assert [r.name for r in list_releases(lake)] == ["clean", "leaky"]
    allowed = datahub("release", "merge", "mix", "--from", "clean", "--from", "leaky", "--lake", lake.root,
                      "--allow-contamination", "held-out split", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["details"]["contamination"]["allowed"] == "held-out split"
    helped = datahub("release", "redact", "--help")
    assert helped.returncode == 0
    assert "not re-checked against the eval sets" in " ".join(helped.stdout.split()), helped.stdout


def test_a_merge_killed_before_its_record_finishes_with_allow_contamination_once_an_eval_set_is_added(
        tmp_path, kill_before_record):
    """Killed after its table and lineage commits, then an eval set overlapping an input is registered: the gate now
    refuses the re-run without --allow-contamination, and with it the re-run finishes the first try's commits (the
    flag changes no row, so it is not compared with the first try's arguments)."""
    lake = Lake(tmp_path / "lake")
    add_samples(lake, OTHER, "s3://bucket/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "clean", table="other")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "leaky")
    kill_before_record(merge_releases, lake, "mix", sources=["clean", "leaky"])
    assert lake.exists("release_mix") and "mix" not in [r.name for r in list_releases(lake)]
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    with pytest.raises(ReleaseError, match="overlap eval sets"):
        merge_releases(lake, "mix", sources=["clean", "leaky"])
    release = merge_releases(lake, "mix", sources=["clean", "leaky"], allow_contamination="found after the merge")
    assert release.row_count == 9
    assert get_release(lake, "mix").details["contamination"]["allowed"] == "found after the merge"

"""The eval-set gate's verdict in `datahub release create/merge/redact/show` output, and refusals that name the
release, the eval set, the count and both fixes (--allow-contamination, or the ids from `evalset check --ids-out`)."""

from __future__ import annotations

import json
import subprocess
import sys

from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import write_evalset
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, LEAKED


def _datahub(lake: Lake, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args, "--lake", lake.root],
                          capture_output=True, text=True)


def test_release_commands_print_the_eval_set_verdict_and_refusals_name_the_fix(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN + LEAKED, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    unchecked = _datahub(lake, "release", "create", "old", "--json")
    assert unchecked.returncode == 0, unchecked.stderr
    assert json.loads(unchecked.stdout)["evalset_check"]["verdict"] == "not_checked"
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))

    refused = _datahub(lake, "release", "create", "r1")
    assert refused.returncode == 2
    err = " ".join(refused.stderr.split())
    assert "release 'r1' refused: 2 sample(s)" in err and "[bench@1: 2 sample(s)]" in err, err
    assert "datahub evalset check --table samples --version" in err and "--ids-out IDS" in err, err
    assert '--allow-contamination "REASON"' in err, err

    allowed = _datahub(lake, "release", "create", "r1", "--allow-contamination", "dev split", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["evalset_check"] == {
        "verdict": "allowed", "evalsets": ["bench@1"], "contaminated": 2, "by_evalset": {"bench@1": 2},
        "rows_checked": 6, "allowed": "dev split", "reused": {}, "read": ["r1"], "carried_from": None,
        "why_not_checked": None}
    shown = _datahub(lake, "release", "show", "r1")
    assert "eval sets 2 sample(s) overlap eval sets [bench@1: 2], allowed: 'dev split'" in " ".join(
        shown.stdout.split()), shown.stdout

    carried = _datahub(lake, "release", "redact", "r2", "--from", "r1", "--sample", sample_id_of(CLEAN[0]),
                       "--reason", "PII #1")
    assert carried.returncode == 0, carried.stderr
    assert "allowed: 'dev split' (carried from release r1)" in " ".join(carried.stdout.split()), carried.stdout

    clean = _datahub(lake, "release", "redact", "r3", "--from", "r1", "--reason", "bench", "--json",
                     *(arg for text in LEAKED for arg in ("--sample", sample_id_of(text))))
    assert clean.returncode == 0, clean.stderr
    verdict = json.loads(clean.stdout)["evalset_check"]
    assert (verdict["verdict"], verdict["contaminated"], verdict["rows_checked"]) == ("clean", 0, 4)
    merged = _datahub(lake, "release", "merge", "m1", "--from", "r3")
    assert merged.returncode == 0, merged.stderr
    assert "eval sets clean: 4 rows share no n-gram with bench@1 (the check recorded by r3: rows not read again)" in " ".join(
        merged.stdout.split()), merged.stdout

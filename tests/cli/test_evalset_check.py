"""`datahub evalset check` as a scheduled gate: a contaminated table fails the command (like a failed `datahub qa`),
and the printed summary keeps its "[set@version: n sample(s)]" (text, not Rich markup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEAKED = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge the boxing match tonight"
CLEAN = "a different document about rivers, mountains and the long history of the valley towns and their bridges"


def datahub(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def test_a_contaminated_table_fails_the_check_and_names_the_set(tmp_path):
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.run import run_job

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in (LEAKED, CLEAN)))
    spec = validate_job_spec({"name": "c", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(tmp_path / "a.jsonl")}],
                              "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = str(tmp_path / "lake")
    (tmp_path / "bench.jsonl").write_text(json.dumps({"question": "what happened?", "answer": LEAKED}) + "\n")
    (tmp_path / "other.jsonl").write_text(json.dumps({"question": "unrelated", "answer": "nothing shared here"}) + "\n")

    assert datahub("evalset", "add", "other", str(tmp_path / "other.jsonl"), "--lake", lake).returncode == 0
    clean = datahub("evalset", "check", "--lake", lake)
    assert clean.returncode == 0 and "clean: 2 rows" in clean.stdout, clean.stdout + clean.stderr

    assert datahub("evalset", "add", "bench", str(tmp_path / "bench.jsonl"), "--lake", lake).returncode == 0
    dirty = datahub("evalset", "check", "--lake", lake)
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert "overlap eval sets [bench@1: 1 sample(s)]; e.g." in dirty.stdout, dirty.stdout
    as_json = datahub("evalset", "check", "--lake", lake, "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["by_evalset"] == {"bench@1": 1}


def test_a_release_made_before_the_eval_set_was_registered_is_checked_by_name(tmp_path):
    """A release frozen before a benchmark was registered passed the create gate; `evalset check --release NAME`
    checks exactly what it froze (its table and version) and names the release, the sample and the eval item.
    Before, there was no --release: the user had to find the release's table and version themselves."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.lake import Lake
    from datahub.pipeline.run import run_job
    from datahub.release.create import create_release
    from datahub.sample_id import sample_id_of

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in (LEAKED, CLEAN)))
    spec = validate_job_spec({"name": "c", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(tmp_path / "a.jsonl")}],
                              "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = str(tmp_path / "lake")
    create_release(Lake(lake), "r1")  # no eval set yet: the gate had nothing to check
    (tmp_path / "bench.jsonl").write_text(json.dumps({"id": "q7", "question": "what happened?", "answer": LEAKED}) + "\n")
    assert datahub("evalset", "add", "bench", str(tmp_path / "bench.jsonl"), "--lake", lake).returncode == 0

    dirty = datahub("evalset", "check", "--release", "r1", "--lake", lake)
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert "release r1: 1 sample(s) of samples v1 overlap" in dirty.stdout and f"{sample_id_of(LEAKED)} (bench@1:q7)" in dirty.stdout, dirty.stdout
    as_json = datahub("evalset", "check", "--release", "r1", "--lake", lake, "--json")
    assert as_json.returncode == 1
    found = json.loads(as_json.stdout)
    assert found["release"] == "r1" and found["examples"] == {sample_id_of(LEAKED): "bench@1:q7"}

    typo = datahub("evalset", "check", "--release", "r2", "--lake", lake)
    assert typo.returncode == 2 and "no release 'r2'" in typo.stderr and "Traceback" not in typo.stderr, typo.stderr
    both = datahub("evalset", "check", "--release", "r1", "--version", "1", "--lake", lake)
    assert both.returncode == 2 and "--release r1 already fixes the table and version" in both.stderr, both.stderr


def test_ids_out_writes_every_contaminated_id_for_redact_and_the_merge_refusal_says_so(tmp_path):
    """`--json` lists 20 examples only, so the merge refusal's fix (redact the ids, merge the redacted release) could
    not be done with more contaminated samples: `--ids-out FILE` streams every id to a file `release redact
    --ids-file` reads, and the refusal names both."""
    import pytest

    from datahub.errors import ReleaseError
    from datahub.evalset import add_evalset
    from datahub.lake import Lake
    from datahub.release import create_release, merge_releases
    from datahub.sample_id import sample_id_of
    from tests.release.helpers import add_samples

    leaked = [f"post {i}: {LEAKED}" for i in range(25)]
    lake = Lake(tmp_path / "lake")
    add_samples(lake, leaked + [CLEAN], "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    create_release(lake, "r1")
    bench = {"id": "q7", "question": "what happened?", "answer": LEAKED}
    (tmp_path / "bench.jsonl").write_text(json.dumps(bench) + "\n")
    add_evalset(lake, "bench", tmp_path / "bench.jsonl")
    with pytest.raises(ReleaseError, match="--ids-file IDS .*evalset check --release RELEASE --ids-out IDS"):
        merge_releases(lake, "mix", sources=["r1"])
    ids = tmp_path / "ids.txt"
    checked = datahub("evalset", "check", "--release", "r1", "--lake", lake.root, "--json", "--ids-out", str(ids))
    assert checked.returncode == 1 and json.loads(checked.stdout)["contaminated"] == 25, checked.stderr
    assert len(json.loads(checked.stdout)["examples"]) == 20
    assert ids.read_text().splitlines() == sorted(sample_id_of(text) for text in leaked)
    redacted = datahub("release", "redact", "r2", "--from", "r1", "--ids-file", str(ids), "--reason", "bench leak",
                       "--lake", lake.root)
    assert redacted.returncode == 0, redacted.stdout + redacted.stderr
    assert merge_releases(lake, "mix", sources=["r2"]).row_count == 1

"""Release commands report their passes through ``progress(stage, rows done, total)``, as qa and report do: a
release create, merge, redact or diff of a large release takes minutes and must never be silent."""

from __future__ import annotations

from datahub.lake import Lake
from datahub.release import create_release, diff_releases, merge_releases, redact
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples

TEXTS = [f"document number {i} about rivers, bridges and the towns along them" for i in range(5)]


def _calls():
    seen: list[tuple[str, int, int | None]] = []
    return seen, lambda *call: seen.append(call)


def _stages(seen) -> dict[str, tuple[int, int | None]]:
    """Each stage's last call: (rows done, total)."""
    return {stage: (done, total) for stage, done, total in seen}


def test_create_merge_redact_and_diff_report_the_rows_of_each_pass(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, TEXTS, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    seen, progress = _calls()
    create_release(lake, "r1", progress=progress)
    assert seen[0] == ("samples", 0, 5) and _stages(seen)["samples"] == (5, 5)
    assert _stages(seen)["lineage"] == (5, None)

    seen, progress = _calls()
    redact(lake, "r2", source="r1", sample_ids=[sample_id_of(TEXTS[0])], reason="PII", progress=progress)
    assert _stages(seen)["find the rows to remove"] == (1, None)
    assert _stages(seen)["write"] == (4, 4) and _stages(seen)["samples"] == (4, 4)

    seen, progress = _calls()  # a release of the table after the take-down leaves its sample out: a pass more
    create_release(lake, "r3", progress=progress)
    assert _stages(seen)["find taken-down rows"] == (1, None) and _stages(seen)["write"] == (4, None)
    assert _stages(seen)["samples"] == (4, 4)

    seen, progress = _calls()
    merge_releases(lake, "m1", sources=["r1", "r2"], progress=progress)
    assert _stages(seen)["inputs, pass 1"] == (9, 9)  # every row of both inputs, then the 5 distinct ones written
    assert _stages(seen)["write"] == (5, 5) and _stages(seen)["samples"] == (5, 5)

    seen, progress = _calls()
    diff_releases(lake, "r1", "r2", progress=progress)
    assert _stages(seen)["read r1"] == (5, 5) and _stages(seen)["read r2"] == (4, 4)
    assert _stages(seen)["compare"] == (9, None)

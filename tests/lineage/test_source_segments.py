"""`datahub lineage --source` on a file whose record became several samples: a trajectory longer than 1,024 steps
is stored as consecutive segments (one sample each) of one record. Before, the file's story kept one sample id per
record offset, so two of the three segments of the demo's long episode were missing from it ("kept 3" for a file
that wrote 5 samples) and could not be traced from their file."""

from __future__ import annotations

import json

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.lineage import source_lineage
from datahub.pipeline.run import run_job
from tests.cli.conftest import datahub


def _episode(name: str, steps: int) -> dict:
    return {"episode_id": name, "steps": [{"observation": f"{name} step {i}", "action": f"echo {i}", "reward": 0.0}
                                          for i in range(steps)]}


def test_every_segment_of_a_long_episode_is_in_its_files_story(tmp_path):
    source = tmp_path / "rollouts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in (_episode("long", 2500), _episode("short", 3), "broken"))
                      .replace('"broken"', "{not json"))
    spec = validate_job_spec({"name": "rollouts", "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(source), "kind": "trajectory"}],
                              "limits": {"max_record_bytes": 2_000_000}, "graph": {"samples": {"sink": "samples"}}})
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(tmp_path / "lake")
    samples = lake.read("samples", columns=["sample_id", "source_offset", "step_offset"])
    segments = sorted((o, s, i) for i, o, s in zip(samples.column("sample_id").to_pylist(),
                                                     samples.column("source_offset").to_pylist(),
                                                     samples.column("step_offset").to_pylist()))
    assert [(o, s) for o, s, _ in segments] == [(1, 0), (1, 1024), (1, 2048), (2, 0)]

    story = source_lineage(lake, str(source))
    listed = [(r["source_offset"], r["sample_id"], r["fate"]) for r in story.records]
    # one entry per sample, the segments of a record in step order; the unparseable record once, without an id
    assert listed == [(o, i, "kept") for o, _, i in segments] + [(3, None, "quarantined")]
    assert [r.get("step_offset") for r in story.records] == [0, 1024, 2048, None, None]  # set where a record has several
    assert story.counts == {"kept": 4, "quarantined": 1}
    assert story.record_count == 3

    out = datahub("lineage", "--source", str(source), "--lake", str(tmp_path / "lake"))
    assert out.returncode == 0, out.stderr
    # a lookup scans the lake's ingested events: off a terminal it says so (a line per stage, at most every 10 s)
    assert f"lineage --source {source}: lineage events scanned 0" in out.stderr, out.stderr
    assert "3 records: kept 4, quarantined 1" in out.stdout, out.stdout
    for _, _, sample_id in segments:
        assert sample_id in out.stdout
    as_json = json.loads(datahub("lineage", "--source", str(source), "--lake", str(tmp_path / "lake"), "--json").stdout)
    assert len(as_json["records"]) == 5 and as_json["record_count"] == 3

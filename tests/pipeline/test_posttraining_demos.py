"""jobs/chat-demo.yaml, preference-demo.yaml and trajectory-demo.yaml on both engines: bundled records in the public
layouts (malformed ones included), the post-training operators, identical results on Ray and Spark."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from datahub.config.spec import load_job_spec
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)

REPO = Path(__file__).resolve().parents[2]
DEMOS = ("chat", "preference", "trajectory")


def _dropped(lake: Lake) -> dict[str, str]:
    lineage = lake.read("lineage")
    rows = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    return dict(zip(rows.column("sample_id").to_pylist(), rows.column("reason").to_pylist()))


@pytest.fixture(scope="module")
def demos(tmp_path_factory, ray_engine, spark_engine):
    root = tmp_path_factory.mktemp("posttraining-demos")
    here = os.getcwd()
    os.chdir(REPO)  # the jobs name their inputs relative to the repo
    out: dict[str, dict[str, tuple[Lake, object]]] = {}
    try:
        for demo in DEMOS:
            for name, engine in (("ray", ray_engine), ("spark", spark_engine)):
                spec = load_job_spec(REPO / f"jobs/{demo}-demo.yaml",
                                     [f"lake.root={root / demo / name}", f"engine.kind={name}"])
                result = run_job(spec, engine=engine)
                assert result.status == "succeeded", (demo, name, result.error)
                out.setdefault(demo, {})[name] = (Lake(root / demo / name), result)
    finally:
        os.chdir(here)
    return out


@pytest.mark.parametrize("demo", DEMOS)
def test_ray_and_spark_give_the_same_samples_drops_and_quarantine(demos, demo):
    (ray_lake, ray_result), (spark_lake, spark_result) = demos[demo]["ray"], demos[demo]["spark"]
    assert ray_result.counts == spark_result.counts
    columns = ["sample_id", "text", "source_offset"]
    ray_rows = ray_lake.read("samples", columns=columns).sort_by("sample_id").to_pylist()
    assert ray_rows and ray_rows == spark_lake.read("samples", columns=columns).sort_by("sample_id").to_pylist()
    assert _dropped(ray_lake) == _dropped(spark_lake)
    quarantine = [sorted(zip(lake.read("quarantine").column("reason").to_pylist(),
                             lake.read("quarantine").column("detail").to_pylist())) for lake in (ray_lake, spark_lake)]
    assert quarantine[0] == quarantine[1] and quarantine[0]  # every demo file holds malformed records
    counts = spark_result.counts
    assert counts["records_read"] == counts["samples_written"] + counts["dropped_total"] + counts["quarantined_total"]


def test_chat_checks_drop_broken_conversations_and_redact_pii_inside_messages(demos):
    lake, result = demos["chat"]["spark"]
    assert set(result.counts["dropped"]) == {"empty_assistant_turn", "invalid_tool_call_json", "role_order",
                                             "truncated_assistant_turn"}
    assert {"invalid_message", "missing_field", "invalid_json"} <= set(result.counts["quarantined"])
    samples = lake.read("samples", columns=["text", "messages", "quality"]).to_pylist()
    flagged = [s for s in samples if "<EMAIL>" in s["text"]]
    assert len(flagged) == 1 and "maria.lopez@example.org" not in json.dumps(flagged[0]["messages"])
    assert all(m["content"] is None or "@example.org" not in m["content"] for m in flagged[0]["messages"])
    assert "<PHONE>" in flagged[0]["messages"][0]["content"]
    assert all(s["quality"]["chat_turns"] >= 2 for s in samples)


def test_preference_pairs_dedup_on_the_prompt(demos):
    lake, result = demos["preference"]["ray"]
    assert result.counts["dropped"] == {"duplicate_prompt": 1, "identical_pair": 1}
    lineage = lake.read("lineage")
    dup = lineage.filter(pc.equal(lineage.column("reason"), "duplicate_prompt")).to_pylist()
    keeper = json.loads(dup[0]["ref"])["dup_of"]
    kept = {r["sample_id"]: r for r in lake.read("samples", columns=["sample_id", "prompt", "chosen"]).to_pylist()}
    assert keeper in kept  # the other answer to the same prompt stays
    source = lake.read("samples").num_rows
    assert Counter(json.dumps(r["prompt"]) for r in kept.values()).most_common(1)[0][1] == 1 and source == len(kept)


def test_trajectory_lengths_and_segments(demos):
    lake, result = demos["trajectory"]["ray"]
    assert result.counts["dropped"] == {"too_few_steps": 1}
    assert set(result.counts["quarantined"]) >= {"invalid_step"}
    samples = lake.read("samples", columns=["steps", "step_offset"]).to_pylist()
    assert all(1 <= len(s["steps"]) <= 1024 for s in samples)

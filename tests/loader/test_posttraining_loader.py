"""Post-training samples out of the lake and back: the exported ``.json`` member holds the structure (messages,
prompt/chosen/rejected, trajectory steps in segments) byte-reproducibly, and ``ReleaseDataset(decode="structured")``
gives it back as objects; ``replay_steps`` reassembles any step range of a segmented episode."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from datahub.config.spec import load_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.errors import IntegrityError
from datahub.export import export_table_version
from datahub.kinds.posttraining import MAX_STEPS_PER_ROW
from datahub.lake import Lake
from datahub.loader import ReleaseDataset
from datahub.loader.decode import KIND_FIELDS, replay_steps
from datahub.pipeline.run import run_job
from datahub.storage import validate_storage_config

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data/posttraining"
JOBS = ("chat", "preference", "trajectory")


def _export(lake: Lake, cfs: Path, release: str):
    storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(cfs)}}}, source="t.yaml")
    manifest = export_table_version(lake, table="samples", version=lake.version("samples"), release_name=release,
                                    tier="cfs", storage=storage, shard_samples=2)
    return manifest, storage


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Each demo job run in-process, its samples exported twice to two tiers."""
    root = tmp_path_factory.mktemp("posttraining-export")
    out = {}
    here = os.getcwd()
    os.chdir(REPO)
    try:
        for job in JOBS:
            spec = load_job_spec(REPO / f"jobs/{job}-demo.yaml", [f"lake.root={root / job / 'lake'}"])
            result = run_job(spec, engine=ArrowEngine())
            assert result.status == "succeeded", result.error
            lake = Lake(root / job / "lake")
            first = _export(lake, root / job / "cfs-a", f"{job}-v1")
            second = _export(lake, root / job / "cfs-b", f"{job}-v1")
            out[job] = (lake, first, second, root / job)
    finally:
        os.chdir(here)
    return out


def _structured(manifest, storage):
    return list(ReleaseDataset(manifest, storage=storage, decode="structured", shuffle=False, rank=0, world_size=1))


@pytest.mark.parametrize("job", JOBS)
def test_export_is_byte_reproducible_and_json_holds_the_structure(released, job):
    lake, (manifest, storage), _, root = released[job]
    shards_a = sorted((root / "cfs-a").rglob("*.tar"))
    shards_b = sorted((root / "cfs-b").rglob("*.tar"))
    assert len(shards_a) == len(manifest.shards) >= 2
    assert [p.relative_to(root / "cfs-a") for p in shards_a] == [p.relative_to(root / "cfs-b") for p in shards_b]
    for a, b in zip(shards_a, shards_b):
        assert a.read_bytes() == b.read_bytes()
    fields = KIND_FIELDS[job]
    rows = {r["sample_id"]: r for r in lake.read("samples").to_pylist()}
    raw = list(ReleaseDataset(manifest, storage=storage, decode="bytes", shuffle=False, rank=0, world_size=1))
    assert {s["sample_id"] for s in raw} == set(rows) and len(raw) == len(rows) > 0
    schema = json.loads((REPO / "schemas/posttraining-sample.v1.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for sample in raw:
        row = rows[sample["sample_id"]]
        meta = json.loads(sample["json"])
        assert meta["kind"] == job
        validator.validate(meta)  # the documented structure (schemas/posttraining-sample.v1.json)
        for field in fields:  # the lake's typed structure, whole, in the .json member
            assert meta[field] == row[field], field
        assert sample["txt"].decode() == row["text"]


def test_structured_chat_parses_tool_calls_as_in_the_input(released):
    lake, (manifest, storage), _, _ = released["chat"]
    inputs = {}
    for line in (DATA / "chat-openai.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "id" in record:
            inputs[record["id"]] = record
    samples = _structured(manifest, storage)
    assert samples and all(s["kind"] == "chat" and isinstance(s["messages"], list) for s in samples)
    with_calls = [s for s in samples if any(m["tool_calls"] for m in s["messages"])
                  and s["meta"]["source_uri"].endswith("chat-openai.jsonl")]
    assert with_calls  # the bundled OpenAI-layout tool-use conversation is kept
    for sample in with_calls:
        record = inputs[sample["meta"]["meta"]["id"]]
        assert [m["role"] for m in sample["messages"]] == [m["role"] for m in record["messages"]]
        for got, want in zip(sample["messages"], record["messages"]):
            assert got["tool_calls"] == want.get("tool_calls")  # objects again, not JSON text
        assert sample["tools"] == record.get("tools")


def test_structured_preference_pairs(released):
    lake, (manifest, storage), _, _ = released["preference"]
    rows = {r["sample_id"]: r for r in lake.read("samples").to_pylist()}
    samples = _structured(manifest, storage)
    assert len(samples) == len(rows)
    for s in samples:
        row = rows[s["sample_id"]]
        assert s["kind"] == "preference"
        for field in ("prompt", "chosen", "rejected"):
            assert [(m["role"], m["content"]) for m in s[field]] == [(m["role"], m["content"]) for m in row[field]]
        assert (s["chosen_score"], s["rejected_score"]) == (row["chosen_score"], row["rejected_score"])
        assert s["chosen"] and s["rejected"]


def test_replay_a_step_range_across_segments(released):
    lake, (manifest, storage), _, _ = released["trajectory"]
    samples = _structured(manifest, storage)
    episodes: dict[str, list[dict]] = {}
    for s in samples:
        assert s["kind"] == "trajectory" and len(s["steps"]) <= MAX_STEPS_PER_ROW
        episodes.setdefault(s["episode_id"], []).append(s)
    long_id, segments = max(episodes.items(), key=lambda kv: kv[1][0]["episode_steps"])
    length = segments[0]["episode_steps"]
    assert len(segments) >= 2 and length > MAX_STEPS_PER_ROW  # the bundled long episode, stored in segments
    whole = [step for seg in sorted(segments, key=lambda s: s["step_offset"]) for step in seg["steps"]]
    assert len(whole) == length
    # from the input file: the episode's steps in order (the demo redacts nothing in this episode's steps)
    record = next(json.loads(line) for line in (DATA / "trajectory.jsonl").read_text().splitlines()
                  if line.startswith("{") and json.loads(line).get("episode_id") == long_id)
    assert [s.get("action") for s in record["steps"]] == [s["action"] for s in whole]
    start, stop = MAX_STEPS_PER_ROW - 5, 2 * MAX_STEPS_PER_ROW + 7  # spans three segments
    assert replay_steps(reversed(samples), long_id, start, stop) == whole[start:stop]
    assert replay_steps(samples, long_id) == whole
    assert replay_steps(samples, long_id, length - 3, length + 10) == whole[-3:]
    assert replay_steps(samples, long_id, 10, 10) == []
    without_middle = [s for s in samples if not (s["episode_id"] == long_id and s["step_offset"] == MAX_STEPS_PER_ROW)]
    with pytest.raises(IntegrityError, match="in no segment"):
        replay_steps(without_middle, long_id, start, stop)
    assert replay_steps(without_middle, long_id, 0, 100) == whole[:100]
    with pytest.raises(KeyError):
        replay_steps(samples, "no-such-episode")
    with pytest.raises(ValueError):
        replay_steps(samples, long_id, 5, 2)


def test_schema_refuses_broken_structures(released):
    _, (manifest, storage), _, _ = released["trajectory"]
    schema = json.loads((REPO / "schemas/posttraining-sample.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    raw = list(ReleaseDataset(manifest, storage=storage, decode="bytes", shuffle=False, rank=0, world_size=1))
    good = json.loads(raw[0]["json"])
    validator.validate(good)
    too_long = dict(good, steps=good["steps"][:1] * (MAX_STEPS_PER_ROW + 1))
    no_done = dict(good, steps=[{k: v for k, v in good["steps"][0].items() if k != "done"}])
    chat = {"kind": "chat", "sample_id": good["sample_id"],
            "messages": [{"role": "robot", "content": "hi", "name": None, "tool_calls": None, "tool_call_id": None}]}
    for broken in (too_long, no_done, chat, dict(good, kind="audio")):
        assert not validator.is_valid(broken)

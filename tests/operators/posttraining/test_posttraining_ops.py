"""Post-training operators one rule at a time: each bad conversation, pair or episode dropped with its own reason,
good ones kept; prompt-only dedup; PII redaction inside messages and steps (in-process engine)."""

from __future__ import annotations

import json

import pyarrow.compute as pc

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job


def _run(tmp_path, kind, records, graph):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = validate_job_spec({"name": kind, "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(path), "kind": kind}],
                              "graph": {**graph, "samples": {"sink": "samples", "after": [list(graph)[-1]]}}},
                             source=str(tmp_path / "job.yaml"))
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    lake = Lake(tmp_path / "lake")
    kept = lake.read("samples")
    lineage = lake.read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped"))
    return kept, dropped, result


def _user(text):
    return {"role": "user", "content": text}


def _assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def test_chat_quality_reasons(tmp_path):
    records = [
        {"messages": [_user("How do I see open ports?"), _assistant("Run `ss -tlnp`.")]},                    # kept
        {"messages": [_user("Only a question")]},                                                              # too few
        {"messages": [_assistant("Hi"), _user("hello"), _assistant("How can I help?")]},                      # role order
        {"messages": [_user("Say something"), _assistant("   ")]},                                             # empty
        {"messages": [_user("Disk?"), _assistant(None, tool_calls=[{"id": "c", "type": "function", "function": {
            "name": "df", "arguments": "{\"path\": "}}]), {"role": "tool", "tool_call_id": "c", "content": "x"},
            _assistant("Done.")]},                                                                             # bad JSON
        {"messages": [_user("Explain pipefail"), _assistant("It makes a pipeline fail when any command in it fails, so the")]},
    ]
    kept, dropped, result = _run(tmp_path, "chat", records, {"turns": {"op": "chat_quality"}})
    assert result.counts["dropped"] == {"too_few_turns": 1, "role_order": 1, "empty_assistant_turn": 1,
                                        "invalid_tool_call_json": 1, "truncated_assistant_turn": 1}
    assert kept.num_rows == 1 and "ss -tlnp" in kept.column("text")[0].as_py()
    assert kept.column("quality").combine_chunks().field("chat_turns").to_pylist() == [2]


def test_prompt_dedup_keeps_one_answer_per_prompt_and_exact_dedup_keeps_both(tmp_path):
    records = [{"messages": [_user("What is a wheel?"), _assistant("A built package archive.")]},
               {"messages": [_user("What is a wheel?"), _assistant("A pre-built distribution pip unpacks.")]},
               {"messages": [_user("What is an sdist?"), _assistant("A source archive.")]}]
    kept, _, result = _run(tmp_path / "exact", "chat", records, {"exact": {"op": "exact_dedup"}})
    assert kept.num_rows == 3 and result.counts["dropped_total"] == 0  # different answers: different samples
    kept, dropped, result = _run(tmp_path / "prompt", "chat", records, {"prompts": {"op": "prompt_dedup"}})
    assert result.counts["dropped"] == {"duplicate_prompt": 1} and kept.num_rows == 2
    keeper = json.loads(dropped.column("ref")[0].as_py())["dup_of"]
    assert keeper in kept.column("sample_id").to_pylist()
    assert sorted(t.split("\n")[1] for t in kept.column("text").to_pylist()) == ["What is a wheel?", "What is an sdist?"]


def test_preference_and_trajectory_checks(tmp_path):
    pairs = [{"prompt": "2+2?", "chosen": "4", "rejected": "5", "score_chosen": 9, "score_rejected": 1},
             {"prompt": "Capital of France?", "chosen": "Paris", "rejected": " Paris "},
             {"prompt": "Best editor?", "chosen": "Any you know well.", "rejected": "vim", "score_chosen": 1,
              "score_rejected": 8}]
    kept, _, result = _run(tmp_path / "pref", "preference", pairs,
                           {"pairs": {"op": "preference_quality", "params": {"min_score_margin": 0.0}}})
    assert result.counts["dropped"] == {"identical_pair": 1, "score_inverted": 1} and kept.num_rows == 1
    episodes = [{"episode_id": "a", "steps": [{"observation": "o", "action": "ls"}, {"observation": "p", "action": "pwd"}]},
                {"episode_id": "b", "steps": [{"observation": "o", "tool_call": "{not json"}, {"observation": "p"}]},
                {"episode_id": "c", "steps": [{"observation": "only one", "action": "exit"}]}]
    kept, _, result = _run(tmp_path / "traj", "trajectory", episodes,
                           {"steps": {"op": "trajectory_quality", "params": {"min_steps": 2}}})
    assert result.counts["dropped"] == {"invalid_tool_call_json": 1, "too_few_steps": 1} and kept.num_rows == 1


def test_pii_redacted_inside_messages_and_steps(tmp_path):
    records = [{"messages": [_user("Mail bob@example.com from 10.0.0.7"), _assistant("Sent to bob@example.com.")]}]
    kept, _, _ = _run(tmp_path / "chat", "chat", records, {"pii": {"op": "redact_pii_messages"}})
    messages = kept.column("messages")[0].as_py()
    assert "bob@example.com" not in json.dumps(messages) and "bob@example.com" not in kept.column("text")[0].as_py()
    assert "<EMAIL>" in messages[1]["content"] and "10.0.0.7" not in messages[0]["content"]
    episodes = [{"episode_id": "e", "steps": [{"observation": "user alice@corp.example wrote", "action": "reply"},
                                              {"observation": "ok", "tool_result": "sent to alice@corp.example"}]}]
    kept, _, _ = _run(tmp_path / "traj", "trajectory", episodes, {"pii": {"op": "redact_pii_messages"}})
    steps = kept.column("steps")[0].as_py()
    assert "alice@corp.example" not in json.dumps(steps) and "<EMAIL>" in steps[1]["tool_result"]

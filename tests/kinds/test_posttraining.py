"""chat, preference and trajectory kinds: readers of the public layouts, canonical text, sample ids, quarantine."""

from __future__ import annotations

import json
import re

import pyarrow.compute as pc
import pytest

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.kinds import kind_spec, row_fields
from datahub.kinds.posttraining import MAX_STEPS_PER_ROW, render_messages
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import identity_normalize

import xxhash


def _run(tmp_path, kind, records, **limits):
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    spec = validate_job_spec({"name": kind, "lake": {"root": str(tmp_path / "lake")},
                              "inputs": [{"uri": str(path), "kind": kind}], "limits": {"max_record_bytes": 2_000_000},
                              "graph": {"samples": {"sink": "samples"}}}, source=str(tmp_path / "job.yaml"))
    result = run_job(spec, engine=ArrowEngine())
    assert result.status == "succeeded", result.error
    lake = Lake(tmp_path / "lake")
    quarantine = lake.read("quarantine") if lake.exists("quarantine") else None
    bad = {} if quarantine is None else dict(zip(quarantine.column("source_offset").to_pylist(),
                                                 zip(quarantine.column("reason").to_pylist(), quarantine.column("detail").to_pylist())))
    return lake.read("samples").sort_by([("source_offset", "ascending"), ("step_offset", "ascending")] if kind == "trajectory"
                                        else [("source_offset", "ascending")]), bad


def test_chat_openai_and_sharegpt_layouts(tmp_path):
    openai = {"id": 1, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
                                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                                    {"role": "tool", "tool_call_id": "c", "content": "42"}],
              "tools": [{"name": "f"}]}
    sharegpt = {"conversations": [{"from": "human", "value": "Hi\nthere"}, {"from": "gpt", "value": "Hello"}]}
    samples, bad = _run(tmp_path, "chat", [openai, sharegpt, {"messages": [{"role": "robot", "content": "x"}]},
                                           {"conversations": [{"from": "gpt", "value": 3}]}, {"text": "plain"}])
    assert samples.column("kind").to_pylist() == ["chat", "chat"]
    first = samples.column("messages")[0].as_py()
    assert [m["role"] for m in first] == ["user", "assistant", "tool"] and first[0]["content"] == "Hi\nthere"
    assert json.loads(first[1]["tool_calls"]) == [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]
    assert json.loads(samples.column("tools")[0].as_py()) == [{"name": "f"}]
    assert json.loads(samples.column("meta")[0].as_py()) == {"id": 1}
    text = samples.column("text")[0].as_py()
    assert text == render_messages(first) and text.startswith("<|user|>\nHi\nthere\n<|assistant|>\n\n<|tool_calls|>\n")
    expected = xxhash.xxh3_128_hexdigest(("chat\x00" + identity_normalize(text)).encode())
    assert samples.column("sample_id")[0].as_py() == expected
    assert bad == {3: ("invalid_message", "messages[0].role: 'robot' is not one of system, user, assistant, tool"),
                   4: ("invalid_field", "conversations[0].value: a int, expected a string"),
                   5: ("missing_field", "no field 'messages' (OpenAI) or 'conversations' (ShareGPT); the record has: 'text'")}


def test_same_prompt_different_answers_are_two_samples_and_kinds_differ_from_text(tmp_path):
    a = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A1"}]}
    b = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A2"}]}
    samples, _ = _run(tmp_path, "chat", [a, b, a])
    ids = samples.column("sample_id").to_pylist()
    assert ids[0] != ids[1] and ids[0] == ids[2]
    assert len(ids[0]) == 32


def test_preference_layouts_and_scores(tmp_path):
    pair = {"prompt": "P", "chosen": "good", "rejected": "bad", "score_chosen": 8, "score_rejected": 2.5, "source": "x"}
    hh = {"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "yes"}],
          "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "no"}]}
    samples, bad = _run(tmp_path, "preference", [pair, hh, {"prompt": "P", "chosen": "c"}, {"prompt": "P", "chosen": "a", "rejected": "b",
                                                                                        "chosen_score": "high"}])
    rows = samples.to_pylist()
    assert [m["content"] for m in rows[0]["prompt"]] == ["P"] and rows[0]["chosen"][0]["role"] == "assistant"
    assert (rows[0]["chosen_score"], rows[0]["rejected_score"]) == (8.0, 2.5)
    assert json.loads(rows[0]["meta"]) == {"source": "x"}
    assert [m["content"] for m in rows[1]["prompt"]] == ["Q"]  # the shared leading turn
    assert [m["content"] for m in rows[1]["chosen"]] == ["yes"] and [m["content"] for m in rows[1]["rejected"]] == ["no"]
    assert rows[1]["text"] == "<|user|>\nQ\n<|chosen|>\n<|assistant|>\nyes\n<|rejected|>\n<|assistant|>\nno"
    assert bad == {3: ("missing_field", "no field 'rejected' (a string or a list of messages)"),
                   4: ("invalid_field", "chosen_score: 'high' is not a finite number")}


def test_long_trajectory_is_split_in_bounded_segments(tmp_path):
    steps = [{"observation": f"o{i}", "action": f"a{i}", "reward": float(i == 2599), "done": i == 2599} for i in range(2600)]
    samples, bad = _run(tmp_path, "trajectory", [{"episode_id": "e", "steps": steps, "task": "t"},
                                                 {"steps": [{"observation": "x", "tool_call": {"name": "f"}}]},
                                                 {"steps": [{"reward": 1}]}])
    long = samples.filter(pc.equal(samples.column("episode_id"), "e"))
    assert long.column("step_offset").to_pylist() == [0, MAX_STEPS_PER_ROW, 2 * MAX_STEPS_PER_ROW]
    assert [len(s) for s in long.column("steps").to_pylist()] == [1024, 1024, 552]
    assert set(long.column("episode_steps").to_pylist()) == {2600}
    body = long.column("text")[1].as_py()  # the plain rendering: trainers read text (decode="text")
    assert body.startswith("<|step 1024|>\n<|observation|>\no1024\n<|action|>\na1024\n<|reward|> 0.0")
    assert "episode_digest" not in samples.column_names  # it goes into the sample_id only
    short = samples.filter(pc.is_null(samples.column("episode_id"))).to_pylist()[0]
    assert short["steps"][0]["tool_call"] == '{"name":"f"}'
    assert bad == {3: ("invalid_step", "steps[0]: no observation, action, tool_call or tool_result")}


def test_kinds_register_typed_columns():
    names = [f.name for f in row_fields(["chat", "preference", "trajectory"])]
    assert names[:3] == ["kind", "messages", "tools"] and "steps" in names and "chosen" in names
    message = kind_spec("chat").fields[0].type.value_type
    assert [f.name for f in message] == ["role", "content", "name", "tool_calls", "tool_call_id"]
    with pytest.raises(Exception):
        kind_spec("nope")


def test_the_schema_accepts_every_row_the_readers_write(tmp_path):
    """schemas/posttraining-sample.v1.json required episode_id to be a string, but an episode without one is read
    (documented: null, source_uri and source_offset name it) and exported as "episode_id": null."""
    from pathlib import Path

    import jsonschema

    from datahub.export.samples import json_records

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas/posttraining-sample.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    cases = {
        "trajectory": [{"steps": [{"observation": "o", "action": "a"}]},
                       {"episode_id": 7, "steps": [{"observation": "o", "tool_call": {"name": "f"}, "tool_result": "r"}]}],
        "chat": [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                                    "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]}],
        "preference": [{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                        "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]}],
    }
    for kind, records in cases.items():
        (tmp_path / kind).mkdir()
        samples, bad = _run(tmp_path / kind, kind, records)
        assert not bad and samples.num_rows == len(records)
        columns = ["kind", "sample_id", *(f.name for f in kind_spec(kind).fields)]
        for member in json_records(samples.select(columns), columns).to_pylist():
            errors = [e.message for e in validator.iter_errors(json.loads(member))]
            assert not errors, (kind, errors)


def test_preference_conversations_that_repeat_the_prompt_are_not_doubled(tmp_path):
    """UltraFeedback-binarized rows carry `prompt` AND whole conversations in chosen/rejected (user turn included):
    the prompt was kept twice (prompt + a user turn inside each reply), so a DPO trainer saw it twice."""
    conversation = lambda answer: [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": answer}]  # noqa: E731
    records = [{"prompt": "Q?", "chosen": conversation("yes"), "rejected": conversation("no"),
                "score_chosen": 8.0, "score_rejected": 3.0},
               {"chosen": conversation("yes"), "rejected": conversation("no")}]  # the same pair without prompt
    samples, bad = _run(tmp_path, "preference", records)
    assert not bad
    first, second = samples.to_pylist()
    assert [m["content"] for m in first["prompt"]] == ["Q?"]
    assert [(m["role"], m["content"]) for m in first["chosen"]] == [("assistant", "yes")]
    assert [(m["role"], m["content"]) for m in first["rejected"]] == [("assistant", "no")]
    assert first["text"] == second["text"] and first["sample_id"] == second["sample_id"]


def test_preference_without_a_prompt_to_share_is_quarantined(tmp_path):
    """Without `prompt`, the prompt is chosen's and rejected's shared leading turns; replies to two different
    questions gave an empty prompt and were kept as a pair (cc8df0f quarantines them). Two bare replies (reward-model
    data: plain strings, or assistant messages only) have no question to disagree on: kept with an empty prompt, as
    before cc8df0f quarantined them too."""
    records = [{"chosen": [{"role": "user", "content": "Q1?"}, {"role": "assistant", "content": "a"}],
                "rejected": [{"role": "user", "content": "Q2?"}, {"role": "assistant", "content": "b"}]},
               {"chosen": "a", "rejected": "b"},
               {"prompt": "Q3?", "chosen": "c", "rejected": "d"},
               {"chosen": [{"role": "assistant", "content": "e"}], "rejected": [{"role": "assistant", "content": "f"}]}]
    samples, bad = _run(tmp_path, "preference", records)
    assert samples.column("source_offset").to_pylist() == [2, 3, 4]
    assert {line: reason for line, (reason, _) in bad.items()} == {1: "missing_field"}
    assert "prompt" in bad[1][1] and "share" in bad[1][1]
    bare = samples.to_pylist()[0]
    assert bare["prompt"] == [] and [m["content"] for m in bare["chosen"]] == ["a"]


def test_a_prompt_repeated_by_one_reply_is_taken_off_that_reply(tmp_path):
    """The prompt was taken off the replies only when both repeated it: one whole conversation beside a bare reply
    kept the prompt twice in the conversation."""
    records = [{"prompt": "Q?", "chosen": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "yes"}],
                "rejected": "no"}]
    samples, bad = _run(tmp_path, "preference", records)
    assert not bad
    row = samples.to_pylist()[0]
    assert [(m["role"], m["content"]) for m in row["chosen"]] == [("assistant", "yes")]
    assert [(m["role"], m["content"]) for m in row["rejected"]] == [("assistant", "no")]


def test_anthropic_hh_transcripts_are_split_into_turns(tmp_path):
    """Anthropic HH-RLHF rows are transcript strings ('\\n\\nHuman: ...\\n\\nAssistant: ...'); they became one
    assistant message each with an empty prompt."""
    shared = "\n\nHuman: How do I list files?\n\nAssistant: Use ls.\n\nHuman: And hidden ones?"
    records = [{"chosen": shared + "\n\nAssistant: ls -a", "rejected": shared + "\n\nAssistant: I can't help."}]
    samples, bad = _run(tmp_path, "preference", records)
    assert not bad
    row = samples.to_pylist()[0]
    assert [(m["role"], m["content"]) for m in row["prompt"]] == [
        ("user", "How do I list files?"), ("assistant", "Use ls."), ("user", "And hidden ones?")]
    assert [(m["role"], m["content"]) for m in row["chosen"]] == [("assistant", "ls -a")]
    assert [(m["role"], m["content"]) for m in row["rejected"]] == [("assistant", "I can't help.")]


def test_chat_legacy_openai_function_calls_are_read_as_tool_calls(tmp_path):
    """OpenAI's legacy function-calling layout (assistant `function_call`, role `function`; glaive and the older
    fine-tuning format) was quarantined whole: "messages[2].role: 'function' is not one of ..."."""
    call = {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}
    legacy = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                           {"role": "assistant", "content": None, "function_call": call},
                           {"role": "function", "name": "weather", "content": "12C"},
                           {"role": "assistant", "content": "It is 12C."}],
              "functions": [{"name": "weather"}]}
    samples, bad = _run(tmp_path, "chat", [legacy])
    assert not bad
    messages = samples.column("messages")[0].as_py()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(messages[1]["tool_calls"]) == [{"type": "function", "function": call}]
    assert messages[2]["name"] == "weather" and messages[2]["content"] == "12C"
    assert json.loads(samples.column("tools")[0].as_py()) == [{"name": "weather"}]


def test_segments_of_different_episodes_never_share_a_sample_id(tmp_path):
    """Two episodes with the same first 1,024 steps and different ends gave their first segments one sample_id (the
    segment's rendering alone). A segment's id now also depends on its whole episode (an episode digest hashed with
    the rendering) while its text stays the plain rendering: acbc58c put '<|episode HEX|>' into the text, which
    trainers read. A repeated episode still gets the same ids; an episode of one row keeps its old id."""
    common = [{"observation": f"tick {i}", "action": "wait"} for i in range(MAX_STEPS_PER_ROW)]
    a = {"episode_id": "A", "steps": common + [{"observation": "door opens", "action": "go"}]}
    b = {"episode_id": "B", "steps": common + [{"observation": "alarm", "action": "run"}]}
    short = {"episode_id": "s", "steps": common[:3]}
    samples, _ = _run(tmp_path, "trajectory", [a, b, dict(a, episode_id="A-again"), short])
    ids = {(r["episode_id"], r["step_offset"]): r["sample_id"] for r in samples.to_pylist()}
    texts = {(r["episode_id"], r["step_offset"]): r["text"] for r in samples.to_pylist()}
    assert len({ids[e, o] for e in "AB" for o in (0, MAX_STEPS_PER_ROW)}) == 4
    assert ids["A-again", 0] == ids["A", 0] and ids["A-again", MAX_STEPS_PER_ROW] == ids["A", MAX_STEPS_PER_ROW]
    assert texts["A", 0] == texts["B", 0] and texts["A", 0].startswith("<|step 0|>")
    assert not any("<|episode" in t for t in texts.values())
    one_row = "trajectory\x00" + texts["s", 0]  # an episode of one row: the id as before the digest
    assert ids["s", 0] == xxhash.xxh3_128_hexdigest(identity_normalize(one_row).encode("utf-8"))


def test_pii_redaction_renders_a_segment_plainly(tmp_path):
    from tests.operators.posttraining.test_posttraining_ops import _run as run_graph

    steps = [{"observation": f"mail bob{i}@example.com", "action": "read"} for i in range(MAX_STEPS_PER_ROW + 2)]
    kept, _, _ = run_graph(tmp_path, "trajectory", [{"episode_id": "e", "steps": steps}],
                           {"pii": {"op": "redact_pii_messages"}})
    texts = kept.sort_by("step_offset").column("text").to_pylist()
    assert "@example.com" not in "".join(texts) and texts[1].startswith("<|step 1024|>")


def test_chat_text_parts_of_the_responses_api_are_read(tmp_path):
    """OpenAI Responses-API items carry text as {"type": "input_text" | "output_text", "text"}: they were quarantined
    as unsupported_content ("an image part belongs in an image_text input"); an image part still is."""
    record = {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                           {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}]}
    image = {"messages": [{"role": "user", "content": [{"type": "input_image", "image_url": "x.png"}]},
                          {"role": "assistant", "content": "A cat."}]}
    samples, bad = _run(tmp_path, "chat", [record, image])
    assert [m["content"] for m in samples.column("messages")[0].as_py()] == ["Hi", "Hello."]
    assert {line: reason for line, (reason, _) in bad.items()} == {2: "unsupported_content"}

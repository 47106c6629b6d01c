"""The eval-set gate on post-training kinds: a chat, a preference pair or a trajectory step holding an eval item's
question and answer is caught like a text document holding them. Their ``text`` is the canonical rendering, whose
role markers (``<|user|>``, ``<|assistant|>``, ``<|chosen|>``, ``<|step N|>``) sit between the question and the
answer: an item whose question has fewer words than an n-gram (most short-answer benchmarks) shared no n-gram with
the rendering, and the chat shipped (the same words as a text sample were refused)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from datahub.errors import ReleaseError
from datahub.evalset import add_evalset, contamination
from datahub.kinds.base import row_fields
from datahub.kinds.posttraining import kind_sample_ids, render_messages, render_preference, render_steps
from datahub.lake import Lake
from datahub.lake.tables import SAMPLES
from datahub.release import create_release
from tests.evalset.helpers import write_evalset

QUESTION = "Which planet in our solar system has the most moons?"  # 10 words: below a 13-gram
ANSWER = "Saturn has the most confirmed moons today"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def _message(role: str, content: str) -> dict:
    return {"role": role, "content": content, "name": None, "tool_calls": None, "tool_call_id": None}


def _rows(kind: str, columns: dict, text: str) -> dict:
    return {"kind": kind, "text": text, "source_uri": f"s3://bucket/{kind}.jsonl", "source_offset": 0,
            "source_format": "jsonl", "ingest_run_id": "job-aaaaaaaaaaaa", "meta": "{}", **columns}


def leaked_rows() -> pa.Table:
    """One row per kind holding QUESTION and ANSWER (in a multi-turn chat: its second turn), and a clean chat."""
    chat = [SYSTEM, _message("user", "hello there"), _message("assistant", "hi, how can I help?"),
            _message("user", QUESTION), _message("assistant", ANSWER)]
    clean = [_message("user", "what should I plant in spring?"), _message("assistant", "peas and lettuce")]
    prompt, chosen, rejected = [_message("user", QUESTION)], [_message("assistant", ANSWER)], [
        _message("assistant", "Jupiter, I think")]
    steps = [{"observation": "the task list is open", "action": "read the first task", "tool_call": None,
              "tool_result": None, "reward": 0.0, "done": False},
             {"observation": QUESTION, "action": ANSWER, "tool_call": None, "tool_result": None, "reward": 1.0,
              "done": True}]
    rows = [
        _rows("chat", {"messages": chat}, render_messages(chat)),
        _rows("chat", {"messages": clean}, render_messages(clean)),
        _rows("preference", {"prompt": prompt, "chosen": chosen, "rejected": rejected},
              render_preference(prompt, chosen, rejected)),
        _rows("trajectory", {"episode_id": "e1", "steps": steps, "step_offset": 0, "episode_steps": 2},
              render_steps(steps)),
    ]
    schema = pa.schema(list(SAMPLES) + row_fields(["text", "chat", "preference", "trajectory"]))
    table = pa.Table.from_pylist([{**r, "sample_id": ""} for r in rows], schema)
    ids = pa.concat_arrays([kind_sample_ids(k, table.slice(i, 1)) for i, k in enumerate(table.column("kind").to_pylist())])
    return table.set_column(table.schema.get_field_index("sample_id"), "sample_id", ids)


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "trivia", write_evalset(tmp_path / "trivia.jsonl", items=[("t1", QUESTION, ANSWER)]))
    lake.commit("samples", leaked_rows(), txn="job-aaaaaaaaaaaa", metadata={"datahub.run_id": "job-aaaaaaaaaaaa"})
    return lake


def test_the_eval_items_question_and_answer_inside_a_chat_a_preference_and_a_trajectory_are_caught(lake):
    rows = leaked_rows()
    found = contamination(lake)
    leaked = {sid for sid, kind, text in zip(rows.column("sample_id").to_pylist(), rows.column("kind").to_pylist(),
                                            rows.column("text").to_pylist()) if QUESTION in text}
    assert set(found.refs) == leaked and len(leaked) == 3, found.describe()
    assert set(found.refs.values()) == {"trivia@1:t1"}


def test_a_release_of_a_chat_holding_an_eval_item_is_refused(lake):
    with pytest.raises(ReleaseError, match=r"3 sample\(s\) of samples v\d+ overlap eval sets \[trivia@1: 3 sample"):
        create_release(lake, "chat-r")

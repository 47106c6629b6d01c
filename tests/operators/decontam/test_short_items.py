"""Short eval items and clean chats: a chat turn "1", "Yes.", "Thank you.", "OK" or "Positive." is not an eval item.

Eval sets registered before ``evalset add`` refused label-only and very short items (a WinoGrande, SST-2 or MNLI
record read as its label alone: "1", "positive", "entailment") still load; the conversation views of a chat
(``views.match_rows``) match such an item only from ``MIN_VIEW_WORDS`` words, so a clean chat is neither refused by
the release gate nor dropped by ``decontaminate@2``. A short real question with its answer inside a chat is caught."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from datahub.errors import ReleaseError
from datahub.evalset.registry import MIN_ITEM_WORDS, _register, add_evalset
from datahub.kinds.base import row_fields
from datahub.kinds.posttraining import kind_sample_ids, render_messages
from datahub.lake import Lake
from datahub.lake.tables import SAMPLES
from datahub.operator import DROP_REASON, DROP_REF
from datahub.release import create_release
from operators.decontam.ngrams import NgramIndex
from operators.decontam.op import MarkContaminated
from operators.decontam.views import MIN_VIEW_WORDS, match_rows
from tests.release.test_evalset_kinds import _message, _rows

# label-only and very short items as an older datahub registered them (the registry refuses them now)
SHORT_ITEMS = ["1", "positive", "true", "entailment", "Yes.", "Thank you.", "OK", "Done."]
QUESTION, ANSWER = "What is the capital of France?", "Paris"  # 6 words + answer: an item of 7 words


def _chat_rows(*chats: list[dict]) -> pa.Table:
    rows = [_rows("chat", {"messages": chat}, render_messages(chat)) for chat in chats]
    table = pa.Table.from_pylist([{**r, "sample_id": ""} for r in rows],
                                 pa.schema(list(SAMPLES) + row_fields(["text", "chat"])))
    return table.set_column(table.schema.get_field_index("sample_id"), "sample_id", kind_sample_ids("chat", table))


CLEAN = [_message("user", "Reply with just the number: how many moons does Earth have?"), _message("assistant", "1"),
         _message("user", "Is that right?"), _message("assistant", "Yes."), _message("user", "Thank you."),
         _message("assistant", "OK"), _message("user", "Sentiment of 'great film'?"),
         _message("assistant", "Positive."),
         _message("user", "True"), _message("assistant", "Done.")]
LEAK = [_message("user", "hello"), _message("assistant", "hi"), _message("user", QUESTION),
        _message("assistant", ANSWER)]


def _index() -> NgramIndex:
    texts = [*SHORT_ITEMS, f"{QUESTION}\n{ANSWER}"]
    return NgramIndex.build(pa.array(texts), [f"old@1:{i}" for i in range(len(texts))])


def test_a_clean_chat_of_short_turns_matches_no_short_item_and_a_short_question_still_matches():
    matches = match_rows(_index(), _chat_rows(CLEAN, LEAK))
    assert matches.counts.tolist() == [0, 1]
    assert matches.first_item.tolist() == [-1, len(SHORT_ITEMS)]


def test_decontaminate_keeps_the_clean_chat_and_drops_the_leak():
    marked = MarkContaminated(_index(), 1, "decontaminate@2")(_chat_rows(CLEAN, LEAK))
    assert marked.column(DROP_REASON).to_pylist() == [None, "contaminated"]
    assert marked.column(DROP_REF).to_pylist() == [None, f"old@1:{len(SHORT_ITEMS)}"]


def _legacy_lake(tmp_path, *chats: list[dict]) -> Lake:
    lake = Lake(tmp_path / "lake")
    texts = [*SHORT_ITEMS, f"{QUESTION}\n{ANSWER}"]
    items = pa.table({"item_id": [f"w{i}" for i in range(len(texts))], "prompt": [None] * len(SHORT_ITEMS) + [QUESTION],
                      "answer": [*SHORT_ITEMS, ANSWER], "text": texts}, pa.schema(
        [("item_id", pa.string()), ("prompt", pa.string()), ("answer", pa.string()), ("text", pa.string())]))
    _register(lake, "old", items, tmp_path / "old.jsonl")  # as a registry before MIN_ITEM_WORDS wrote it
    lake.commit("samples", _chat_rows(*chats), txn="job-aaaaaaaaaaaa", metadata={"datahub.run_id": "job-aaaaaaaaaaaa"})
    return lake


def test_the_release_gate_passes_a_clean_chat_against_a_legacy_set_of_short_items(tmp_path):
    assert create_release(_legacy_lake(tmp_path, CLEAN), "r").name == "r"


def test_the_release_gate_refuses_a_chat_holding_a_short_question_and_its_answer(tmp_path):
    with pytest.raises(ReleaseError, match=r"1 sample\(s\) of samples v\d+ overlap eval sets \[old@1: 1 sample"):
        create_release(_legacy_lake(tmp_path, CLEAN, LEAK), "r")


def test_the_view_floor_is_no_higher_than_the_registrys():
    """Every item ``evalset add`` accepts must be matchable inside a chat: a view of an item's own words is as long as
    the item, so the floor loses nothing only while it is at most the registry's."""
    assert MIN_VIEW_WORDS <= MIN_ITEM_WORDS


BOUNDARY = ("Capital of France?", "Paris")  # MIN_ITEM_WORDS words exactly: 3 of question, 1 of answer


def test_an_item_of_exactly_the_registrys_floor_is_caught_inside_a_chat(tmp_path):
    """A floor above 4 (review finding 4: MIN_VIEW_WORDS = 5 passed every test) lets this registrable item leak."""
    path = tmp_path / "boundary.jsonl"
    path.write_text(json.dumps({"id": "b1", "question": BOUNDARY[0], "answer": BOUNDARY[1]}) + "\n")
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "boundary", path)
    chat = [_message("system", "You are helpful."), _message("user", BOUNDARY[0]), _message("assistant", BOUNDARY[1])]
    index = NgramIndex.build(pa.array([f"{BOUNDARY[0]}\n{BOUNDARY[1]}"]), ["boundary@1:b1"])
    assert match_rows(index, _chat_rows(chat, CLEAN)).counts.tolist() == [1, 0]
    lake.commit("samples", _chat_rows(chat, CLEAN), txn="job-bbbbbbbbbbbb",
                metadata={"datahub.run_id": "job-bbbbbbbbbbbb"})
    with pytest.raises(ReleaseError, match=r"1 sample\(s\) of samples v\d+ overlap eval sets \[boundary@1: 1 sample"):
        create_release(lake, "r")


CJK = ("中国的首都是哪座城市？", "北京")  # 2 words to the matcher (whitespace runs after punctuation to spaces)


def test_an_item_in_a_script_without_spaces_is_caught_inside_a_chat(tmp_path):
    """``evalset add`` accepts it (the matcher sees a CJK sentence as one word: the floor counts its letters), and the
    views' floor must not drop it either: it was caught by the pair view before the floor, missed at 3d8bb43 (review
    finding 2). A clean CJK chat of other words, or of turns as short as a legacy label ("是", "好的"), matches
    nothing."""
    path = tmp_path / "cjk.jsonl"
    path.write_text(json.dumps({"id": "z", "question": CJK[0], "answer": CJK[1]}, ensure_ascii=False) + "\n")
    lake = Lake(tmp_path / "lake")
    add_evalset(lake, "cjk", path)
    leak = [_message("user", "你好"), _message("assistant", "你好！"), _message("user", CJK[0]),
            _message("assistant", CJK[1])]
    clean = [_message("user", "上海在哪里？"), _message("assistant", "中国东部"), _message("user", "好"),
             _message("assistant", "北京")]
    legacy = ["是", "好的", "正面", "谢谢你"]  # label-only or tiny items an older registry accepted
    index = NgramIndex.build(pa.array([f"{CJK[0]}\n{CJK[1]}", *legacy]), ["cjk@1:z", *(f"old@1:{t}" for t in legacy)])
    polite = [_message("user", "是吗？"), _message("assistant", "是"), _message("user", "好的"),
              _message("assistant", "谢谢你"), _message("user", "正面")]
    assert match_rows(index, _chat_rows(leak, clean, polite)).counts.tolist() == [1, 0, 0]
    lake.commit("samples", _chat_rows(leak, clean), txn="job-cccccccccccc",
                metadata={"datahub.run_id": "job-cccccccccccc"})
    with pytest.raises(ReleaseError, match=r"1 sample\(s\) of samples v\d+ overlap eval sets \[cjk@1: 1 sample"):
        create_release(lake, "r")

"""``views.match_rows``: a chat's, preference pair's or trajectory's conversation matched as the registry builds an
eval item's text, and the ``decontaminate`` operator dropping such a chat."""

from __future__ import annotations

import pyarrow as pa

from datahub.operator import DROP_REASON, DROP_REF
from operators.decontam.ngrams import NgramIndex
from operators.decontam.op import MarkContaminated
from operators.decontam.views import match_rows, matched_columns
from tests.release.test_evalset_kinds import ANSWER, QUESTION, leaked_rows

INDEX = NgramIndex.build(pa.array([f"{QUESTION}\n{ANSWER}", "a different item that nobody wrote down anywhere"]),
                         ["trivia@1:t1", "trivia@1:t2"])


def test_each_kind_holding_the_item_matches_it_and_the_rendering_alone_does_not():
    rows = leaked_rows()
    assert INDEX.match(rows.column("text")).counts.tolist() == [0, 0, 0, 0]  # what the gate saw before
    matches = match_rows(INDEX, rows)
    assert (matches.counts > 0).tolist() == [True, False, True, True]
    assert matches.first_item.tolist() == [0, -1, 0, 0]


def test_a_text_only_table_is_matched_by_its_text_alone():
    table = pa.table({"sample_id": ["a", "b"], "text": [f"{QUESTION} {ANSWER}", "nothing here"]})
    assert matched_columns(table.column_names) == ["sample_id", "text"]
    assert match_rows(INDEX, table).counts.tolist() == INDEX.match(table.column("text")).counts.tolist()


def test_the_operator_drops_a_chat_holding_the_item():
    rows = leaked_rows()
    marked = MarkContaminated(INDEX, 1, "decontaminate@2")(rows)
    assert marked.column(DROP_REASON).to_pylist() == ["contaminated", None, "contaminated", "contaminated"]
    assert marked.column(DROP_REF).to_pylist() == ["trivia@1:t1", None, "trivia@1:t1", "trivia@1:t1"]


def test_a_chat_answering_a_benchmarks_question_turns_matches_an_item_registered_without_answers():
    """MT-Bench's items are user turns only (``turns``): the registry's text is the turns, one per line; a chat that
    asks them and answers each holds them apart, with the answers between."""
    from operators.decontam.views import match_rows as match
    from datahub.kinds.posttraining import MESSAGES, render_messages

    turns = ["Name three primary colors.", "Now sort them by wavelength."]  # short: whole-text equality only
    index = NgramIndex.build(pa.array(["\n".join(turns)]), ["mtbench@1:81"])
    chat = [{"role": "user", "content": turns[0], "name": None, "tool_calls": None, "tool_call_id": None},
            {"role": "assistant", "content": "Red, yellow and blue.", "name": None, "tool_calls": None,
             "tool_call_id": None},
            {"role": "user", "content": turns[1], "name": None, "tool_calls": None, "tool_call_id": None},
            {"role": "assistant", "content": "Blue, yellow, red.", "name": None, "tool_calls": None,
             "tool_call_id": None}]
    table = pa.table({"text": [render_messages(chat)], "messages": pa.array([chat], MESSAGES)})
    assert match(index, table).counts.tolist() == [1]


def test_a_column_named_like_a_conversation_but_of_another_type_is_left_to_the_text():
    """A text table with a plain-string ``prompt`` column of its own: matched by ``text`` alone, not an error."""
    table = pa.table({"sample_id": ["a"], "text": [f"{QUESTION}\n{ANSWER}"], "prompt": ["a string, not messages"],
                      "steps": pa.array([[1, 2]], pa.list_(pa.int64()))})
    assert match_rows(INDEX, table).counts.tolist() == INDEX.match(table.column("text")).counts.tolist() == [5]


def test_slices_and_null_messages_match_as_their_rows_do():
    rows = leaked_rows()
    whole = match_rows(INDEX, rows).counts.tolist()
    for start in range(rows.num_rows):
        assert match_rows(INDEX, rows.slice(start, 2)).counts.tolist() == whole[start:start + 2]
    from datahub.kinds.posttraining import MESSAGES

    nulls = pa.table({"text": ["x", "y"], "messages": pa.array([[None, {"role": "user", "content": QUESTION}], None],
                                                               MESSAGES)})
    assert match_rows(INDEX, nulls).counts.tolist() == [0, 0]

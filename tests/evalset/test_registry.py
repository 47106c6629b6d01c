"""The eval-set registry: versioned rows in the lake's ``evalsets`` table with ``ingested`` lineage."""

from __future__ import annotations

import gzip
import json

import pyarrow.compute as pc
import pytest

from datahub.errors import LakeError, SpecError
from datahub.evalset import add_evalset, list_evalsets, read_items
from datahub.lake import Lake
from datahub.sample_id import sample_id_of
from operators.decontam.evalsets import latest_items, load_index
from tests.evalset.helpers import QUESTIONS, item_text, write_evalset


def test_add_list_versions_and_lineage(tmp_path):
    lake = Lake(tmp_path / "lake")
    path = write_evalset(tmp_path / "bench.jsonl")
    first = add_evalset(lake, "bench", path)
    assert (first.name, first.version, first.items, first.created) == ("bench", 1, 3, True)

    again = add_evalset(lake, "bench", path)  # same content: no new version, nothing written
    assert (again.version, again.created) == (1, False)
    assert lake.read("evalsets").num_rows == 3

    write_evalset(path, QUESTIONS[:2])  # the benchmark lost an item: version 2
    second = add_evalset(lake, "bench", path)
    assert (second.version, second.items) == (2, 2)
    listed = list_evalsets(lake)
    assert [(s.name, s.version, s.items, s.versions) for s in listed] == [("bench", 2, 2, 2)]
    assert [s.version for s in list_evalsets(lake, all_versions=True)] == [1, 2]

    latest = latest_items(lake)
    assert latest.column("item_id").to_pylist() == ["q1", "q2"] and set(latest.column("version").to_pylist()) == {2}
    assert load_index(lake).refs == ["bench@2:q1", "bench@2:q2"]

    lineage = lake.read("lineage")
    ingested = lineage.filter(pc.equal(lineage.column("op"), "evalset.add@1"))
    assert ingested.num_rows == 5 and set(ingested.column("action").to_pylist()) == {"ingested"}
    row = ingested.filter(pc.equal(ingested.column("ref"), "bench@1:q3")).to_pylist()[0]
    assert row["sample_id"] == sample_id_of(item_text("q3")) and row["run_id"] == "evalset/bench@1"


def test_field_aliases_gzip_and_record_numbers(tmp_path):
    path = tmp_path / "b.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"prompt": "p one", "output": ["a", "b"]}) + "\n\n")
        handle.write(json.dumps({"input": "p two of four", "target": 3}) + "\n")
    items = read_items(path)
    assert items.column("item_id").to_pylist() == ["0", "1"]
    assert items.column("text").to_pylist() == ['p one\n["a", "b"]', "p two of four\n3"]


@pytest.mark.parametrize("content, message", [
    ('{"id": 1, "question": "q"}\nnot json\n', r"bad.jsonl:2: not a JSON object"),
    ('{"id": 1, "title": "q"}\n', r"bad.jsonl:1: no prompt or answer text.*got id, title"),
    ('{"id": 1, "question": "a"}\n{"id": 1, "question": "b"}\n', r"item id '1' appears twice"),
    ("", r"no items"),
])
def test_bad_files_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(SpecError, match=message):
        add_evalset(Lake(tmp_path / "lake"), "bench", path)
    assert not Lake(tmp_path / "lake").exists("evalsets")


def test_bad_names_and_unknown_sets(tmp_path):
    lake = Lake(tmp_path / "lake")
    path = write_evalset(tmp_path / "b.jsonl")
    with pytest.raises(SpecError, match="eval set name 'a:b'"):
        add_evalset(lake, "a:b", path)
    with pytest.raises(LakeError, match="not registered.*datahub evalset add"):
        load_index(lake, ["missing"])
    add_evalset(lake, "bench", path)
    with pytest.raises(LakeError, match=r"missing not registered.*registered: bench"):
        load_index(lake, ["missing"])


def test_chat_and_code_benchmark_layouts_are_read_whole(tmp_path):
    """The chat demo's next step is a chat benchmark: its items are conversations (OpenAI `messages`, ShareGPT
    `conversations`, MT-Bench `turns` with `question_id`), and HumanEval's answer is `canonical_solution` under a
    `task_id`. Before, the first three were refused ("no prompt or answer text ... (got messages)") and HumanEval
    registered its prompt only (so a leaked solution was never matched) under positional ids."""
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "c1", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": [{"type": "text", "text": "How do I list files?"}]},
                                  {"role": "assistant", "content": "Use ls -la in the directory."}]},
        {"id": "s1", "conversations": [{"from": "human", "value": "What is a symlink?"},
                                       {"from": "gpt", "value": "A file that points at another path."}]},
        {"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post.", "Rewrite it in limericks."]},
        {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n"},
    ]) + "\n")
    items = read_items(path).to_pylist()
    assert [i["item_id"] for i in items] == ["c1", "s1", "81", "HumanEval/0"]
    assert items[0]["prompt"] == "How do I list files?" and items[0]["answer"] == "Use ls -la in the directory."
    assert items[1]["prompt"] == "What is a symlink?" and items[1]["answer"] == "A file that points at another path."
    assert items[2]["prompt"] == "Compose a travel blog post.\nRewrite it in limericks." and items[2]["answer"] is None
    assert items[3]["answer"] == "    return a + b\n"
    assert items[3]["text"] == "def add(a, b):\n\n    return a + b\n"


def test_a_directory_given_as_the_eval_set_file_says_so(tmp_path):
    """Before: "no such eval-set file" for a directory that exists, which sent the user looking for a typo."""
    with pytest.raises(SpecError, match=r"a directory; give the eval-set file in it"):
        read_items(tmp_path)


def test_a_chat_benchmarks_system_prompt_is_not_part_of_its_items(tmp_path):
    """Review finding on the conversation layouts: every non-assistant turn went into the prompt, system prompts
    included; those are boilerplate shared across items and across chat corpora (Llama-2's default one is ~100
    words), so every sample carrying the same system prompt was flagged contaminated. System, developer and tool
    turns are left out."""
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({"id": "q1", "messages": [
        {"role": "system", "content": "You are a concise assistant for a Linux operations team."},
        {"role": "developer", "content": "Answer in one line."},
        {"role": "user", "content": "Which signal does kill send by default?"},
        {"role": "tool", "content": "man kill: SIGTERM"},
        {"role": "assistant", "content": "SIGTERM."}]}) + "\n")
    (item,) = read_items(path).to_pylist()
    assert item["prompt"] == "Which signal does kill send by default?" and item["answer"] == "SIGTERM."


LAYOUTS = [  # (record, the item text read) of benchmarks whose question is in none of PROMPT_FIELDS
    ({"idx": 0, "sentence": "a gorgeous, witty, seductive movie .", "label": 1},
     "a gorgeous, witty, seductive movie .\n1"),  # SST-2
    ({"id": "w1", "sentence": "The trophy does not fit into the suitcase because _ is too large.",
      "option1": "the trophy", "option2": "the suitcase", "answer": "1"},
     "The trophy does not fit into the suitcase because _ is too large.\nthe trophy\nthe suitcase\n1"),  # WinoGrande
    ({"premise": "A man inspects a uniform.", "hypothesis": "The man is sleeping.", "label": "contradiction"},
     "A man inspects a uniform.\nThe man is sleeping.\ncontradiction"),  # MNLI
    ({"ctx": "A woman is outside with a bucket and a dog.", "endings": ["She rinses the bucket.", "She sits."],
      "label": "0"}, "A woman is outside with a bucket and a dog.\nShe rinses the bucket.\nShe sits.\n0"),  # HellaSwag
    ({"goal": "How do I ready a guinea pig cage?", "sol1": "Fill it with paper.", "sol2": "Fill it with jam.",
      "label": 0}, "How do I ready a guinea pig cage?\nFill it with paper.\nFill it with jam.\n0"),  # PIQA
]


def test_common_benchmark_layouts_are_read_with_their_question(tmp_path):
    """These layouts have no prompt field: the item text was the label alone ("1"), which matched any chat turn "1"
    and indexed none of the benchmark's words."""
    path = tmp_path / "layouts.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record, _ in LAYOUTS))
    assert read_items(path).column("text").to_pylist() == [text for _, text in LAYOUTS]


@pytest.mark.parametrize("record, message", [
    ({"id": "w1", "label": 1, "idx": 7}, r"(?s)short.jsonl:2: item 'w1' has no prompt.*fields found: id, idx, label.*"
                                         r"--prompt-field FIELD"),
    ({"id": "w1", "text": "The trophy does not fit.", "answer": "1"}, r"short.jsonl:2: item 'w1' has no prompt"),
    ({"id": "w1", "prompt": "Thank you.", "answer": None}, r"(?s)short.jsonl:2: item 'w1' is 2 word\(s\).*fields "
                                                           r"found: answer, id, prompt.*at least 4 words"),
    ({"id": "w1", "question": "Yes?", "answer": "No."}, r"short.jsonl:2: item 'w1' is 2 word"),
])
def test_an_item_without_a_prompt_or_of_few_words_is_refused(tmp_path, record, message):
    path = tmp_path / "short.jsonl"
    path.write_text(json.dumps({"id": "ok", "question": "What is the capital city of France?", "answer": "Paris"})
                    + "\n" + json.dumps(record) + "\n")
    with pytest.raises(SpecError, match=message):
        add_evalset(Lake(tmp_path / "lake"), "bench", path)


def test_prompt_fields_name_the_question(tmp_path):
    path = tmp_path / "custom.jsonl"
    path.write_text(json.dumps({"id": "c1", "text": "The trophy does not fit.", "choice": "the trophy",
                                "answer": "1"}) + "\n")
    items = read_items(path, prompt_fields=["text", "choice"])
    assert items.column("text").to_pylist() == ["The trophy does not fit.\nthe trophy\n1"]
    with pytest.raises(SpecError, match=r"custom.jsonl:1: none of the prompt fields question_text"):
        read_items(path, prompt_fields=["question_text"])


def test_responses_api_content_parts_are_read_as_text(tmp_path):
    """The OpenAI Responses API's ``input_text`` / ``output_text`` parts (as the chat reader reads them): an item in that
    layout lost its text (only ``text`` parts were read), so it registered as no prompt or a partial one."""
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps({"id": "r1", "messages": [
        {"role": "user", "content": [{"type": "input_text", "text": "Which signal does kill send by default?"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "SIGTERM, signal number 15."}]}]}) + "\n")
    item = read_items(path).to_pylist()[0]
    assert (item["prompt"], item["answer"]) == ("Which signal does kill send by default?", "SIGTERM, signal number 15.")


LONG_ANSWER = ("The mitochondria produce most of the chemical energy needed to power the biochemical reactions of the "
               "cell")


@pytest.mark.parametrize("field", ["output", "target", "completion", "response", "solution"])
def test_an_answer_only_item_of_many_words_is_accepted(tmp_path, field):
    """Reference completions and summarization targets have no prompt: a long one is matched by its 13-grams, so it
    cannot flag a clean "1" or "OK". They were accepted before this session and refused by 3d8bb43 (review finding 1);
    only a short one (a label) is refused."""
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"id": "a1", field: LONG_ANSWER}) + "\n")
    items = read_items(path)
    assert items.column("text").to_pylist() == [LONG_ANSWER]
    assert add_evalset(Lake(tmp_path / "lake"), "answers", path).items == 1


def test_items_in_unspaced_scripts_are_accepted(tmp_path):
    """Chinese, Japanese and Thai have no spaces between words: the matcher (``NgramHasher``) sees a sentence as one
    word, so a floor counted in its words says nothing about such an item. C-Eval- and CMMLU-style items were refused
    as "2 word(s)" (review finding 2). Such an item is held to the floor in letters and digits: a label ("正面") or
    a 3-letter question and answer is what clean chats say, and is refused."""
    path = tmp_path / "cjk.jsonl"
    records = [{"id": "z", "question": "中国的首都是哪座城市？", "answer": "北京"},
               {"id": "j", "question": "日本の首都はどこですか", "answer": "東京"},
               {"id": "t", "question": "เมืองหลวงของประเทศไทยคือเมืองอะไร", "answer": "กรุงเทพ"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    assert add_evalset(Lake(tmp_path / "lake"), "cjk", path).items == 3
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"id": "s1", "sentence": "这部电影很好看", "label": "正面"}, ensure_ascii=False) + "\n"
                     + json.dumps({"id": "s2", "label": "正面"}, ensure_ascii=False) + "\n"
                     + json.dumps({"id": "s3", "question": "对吗？", "answer": "对"}, ensure_ascii=False) + "\n")
    with pytest.raises(SpecError, match=r"2 items under 4 words:\n.*short.jsonl:2: item 's2' has no prompt.*\n.*"
                                        r"short.jsonl:3: item 's3'"):
        read_items(short)


def test_the_floor_counts_words_as_the_matcher_does(tmp_path):
    """U+2028, U+1680 and U+0085 separate words for ``utf8_split_whitespace`` but not for the matcher, which saw
    this item as one word: a chat turn equal to it was floored and not matched (review finding 6)."""
    path = tmp_path / "seps.jsonl"
    path.write_text(json.dumps({"id": "s", "question": "alpha\u2028beta\u1680gamma", "answer": "delta"}) + "\n")
    with pytest.raises(SpecError, match=r"item 's' is 2 word\(s\)"):
        read_items(path)


def test_every_short_item_of_a_file_is_named_at_once(tmp_path):
    """A set with 30 short items needed 30 edit-and-rerun rounds: the error named the first only (review finding 3).
    It now gives the count and the first ``SHORT_ITEMS_SHOWN`` items."""
    path = tmp_path / "many.jsonl"
    records = [{"id": "ok", "question": "What is the capital city of France?", "answer": "Paris"}]
    records += [{"id": f"s{i}", "question": "Largest planet?", "answer": "Jupiter"} for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SpecError) as error:
        read_items(path)
    message = str(error.value)
    assert "30 items" in message and "many.jsonl:2: item 's0' is 3 word(s)" in message
    assert "many.jsonl:11: item 's9'" in message and "many.jsonl:12:" not in message and "20 more" in message


def test_a_plain_text_field_error_names_the_prompt_field_option(tmp_path):
    """LAMBADA's and MBPP's ``text``: ``--prompt-field text`` is the fix, and the error did not say so."""
    path = tmp_path / "lambada.jsonl"
    path.write_text(json.dumps({"id": "l1", "text": "She opened the door and saw her old friend standing there"})
                    + "\n")
    with pytest.raises(SpecError, match=r"lambada.jsonl:1: no prompt or answer text.*--prompt-field FIELD"):
        read_items(path)
    assert read_items(path, prompt_fields=["text"]).num_rows == 1


def test_string_and_untyped_content_parts_are_read_as_the_chat_reader_reads_them(tmp_path):
    """``operators.ingest.chat.content_text`` reads a string part and a dict part with no ``type`` as text; the
    registry dropped both (review finding 8). An image part is still left out of the item's text."""
    path = tmp_path / "parts.jsonl"
    path.write_text(json.dumps({"id": "p1", "messages": [
        {"role": "user", "content": ["Which signal does kill send", {"text": "by default?"},
                                     {"type": "image_url", "image_url": {"url": "x.png"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "SIGTERM, signal number 15."}]}]}) + "\n")
    item = read_items(path).to_pylist()[0]
    assert (item["prompt"], item["answer"]) == ("Which signal does kill send\nby default?",
                                                "SIGTERM, signal number 15.")

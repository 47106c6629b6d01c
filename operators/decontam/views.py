"""What of a sample is matched against the eval n-grams: its ``text`` and, for the post-training kinds, the texts an
eval item would be if it were that conversation.

A chat's, preference pair's or trajectory's ``text`` is its canonical rendering (``datahub.kinds.posttraining``):
role and step markers stand between a question and its answer, so an eval item (``question\\nanswer``, or for a
chat benchmark its user turns then its assistant turns: ``datahub.evalset.registry``) whose question is shorter than
an n-gram shares no n-gram with a chat holding exactly it. So each such row is also matched as views built from its
typed columns the way the registry builds an item's text: every turn alone, every question turn with the answer
turn after it (``question\\nanswer``), the whole conversation as its question turns then its answer turns, and its
question turns alone (an item registered without answers, e.g. MT-Bench's ``turns``) (a preference: its prompt with
the chosen reply, and with the rejected one; a trajectory: each step's observation as the question, its action as the
answer). A row's count is the largest of its texts' (views overlap: a sum would
count one n-gram several times), its first item that text's. Turns of ``SKIPPED_ROLES`` (system prompts, tool
output) are left out as the registry leaves them out. A view of fewer than ``MIN_VIEW_WORDS`` words matches nothing
(a clean "OK" or "1" turn is not an eval item); in a script written without spaces (``UNSPACED_SCRIPTS``), one of
fewer letters and digits. The views of a batch are built with Arrow kernels and numpy and matched one family at a
time, folding each row's best as it goes: a batch holds its turns' text, one family's views (each at most about the
conversation text) and that family's n-grams, not every view's n-grams at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.decontam.ngrams import Matches, NgramIndex

# the roles an eval item's answer comes from, and those left out of it (``datahub.evalset.registry`` reads these)
ANSWER_ROLES = frozenset({"assistant", "gpt", "model", "bot", "chatgpt"})
SKIPPED_ROLES = frozenset({"system", "developer", "tool", "function", "observation", "function_call"})
MESSAGE_COLUMNS = ("messages", "prompt", "chosen", "rejected")  # list<MESSAGE> columns of chat and preference
STEPS_COLUMN = "steps"
VIEW_COLUMNS = (*MESSAGE_COLUMNS, STEPS_COLUMN)
# A view (a turn, a pair, a conversation) of fewer words matches nothing: below 13 words a view matches an item only by
# being equal to it, and a clean chat's "1", "Yes.", "Thank you." or "OK" would equal a label-only or very short item
# ("1" of WinoGrande, "positive" of SST-2, registered before ``evalset add`` refused such items:
# ``datahub.evalset.registry.MIN_ITEM_WORDS``)
MIN_VIEW_WORDS = 4
# Scripts written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer, Burmese): the matcher's words are
# whitespace runs (``NgramHasher``), so such a sentence is one word, or a few split at punctuation, and a floor in words
# says nothing about its length. A text holding one of their letters is held to the floor in letters and digits
# instead: "是", "好的", "谢谢你" (a clean chat's turn, a legacy label) stay under it, a question with its answer does not.
UNSPACED_SCRIPTS = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"
_LETTER_OR_DIGIT = r"[\p{L}\p{N}]"


def unspaced_long_enough(texts: pa.Array | pa.ChunkedArray, floor: int) -> np.ndarray:
    """Per text: whether it holds a letter of a script written without spaces (``UNSPACED_SCRIPTS``) and at least
    ``floor`` letters and digits. No regex runs over an all-ASCII batch (most of a corpus); only such texts are
    copied. The matcher asks it of the views under the word floor only (``NgramIndex.match(spare=)``)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks else pa.array([], pa.string())
    out = np.zeros(len(texts), dtype=bool)
    if len(texts) == 0 or pc.all(pc.fill_null(pc.string_is_ascii(texts), True)).as_py():
        return out
    unspaced = pc.fill_null(pc.match_substring_regex(texts, pattern=UNSPACED_SCRIPTS), False)
    rows = np.flatnonzero(np.asarray(unspaced.to_numpy(zero_copy_only=False), dtype=bool))
    if len(rows):
        letters = pc.count_substring_regex(texts.take(pa.array(rows)), pattern=_LETTER_OR_DIGIT)
        out[rows] = np.asarray(letters.to_numpy(zero_copy_only=False)) >= floor
    return out


def _spared(views: pa.Array) -> np.ndarray:
    """Of views under MIN_VIEW_WORDS words: those in a script without spaces with enough letters to be matched."""
    return unspaced_long_enough(views, MIN_VIEW_WORDS)


def matched_columns(names: Sequence[str]) -> list[str]:
    """The columns of a table with column ``names`` that a check reads: ``sample_id``, ``text`` and the typed
    conversation columns present."""
    return ["sample_id", "text", *(c for c in VIEW_COLUMNS if c in names)]


def match_rows(index: NgramIndex, table: pa.Table | pa.RecordBatch) -> Matches:
    """Per row of ``table``: the matched n-gram count and first matched item of its ``text`` or of its conversation
    views, whichever matches more (the text on a tie, then the earlier view family, then the earlier view). A view of
    fewer than ``MIN_VIEW_WORDS`` words (in a script written without spaces: letters and digits) matches nothing."""
    matches = index.match(_column(table, "text"))
    counts, first = matches.counts.copy(), matches.first_item.copy()
    for owners, views in _view_families(table):  # one family's views and n-grams held at a time, not all at once
        found = index.match(views, min_words=MIN_VIEW_WORDS, spare=_spared)
        hit = np.flatnonzero(found.counts)
        if not len(hit):
            continue
        # per row, its best view (the most matches; the first view on a tie): sorted by row, then count descending
        order = hit[np.lexsort((hit, -found.counts[hit], owners[hit]))]
        row_of, best = np.unique(owners[order], return_index=True)
        chosen = order[best]
        better = found.counts[chosen] > counts[row_of]
        counts[row_of[better]] = found.counts[chosen[better]]
        first[row_of[better]] = found.first_item[chosen[better]]
    return Matches(counts, first)


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    return column


def _conversation_column(table: pa.Table | pa.RecordBatch, name: str, fields: tuple[str, ...]) -> bool:
    """Whether ``table`` has column ``name`` as a list of structs with ``fields`` (a column of that name and another
    type, e.g. a plain-text ``prompt`` of the user's own, is not a conversation and is left to ``text``)."""
    if name not in table.schema.names:
        return False
    kind = table.schema.field(name).type
    return ((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(kind.value_type)
            and all(kind.value_type.get_field_index(f) >= 0 for f in fields))


def _field(values: pa.StructArray, name: str) -> pa.Array:
    """Field ``name`` of ``values``, null where the struct is (``flatten`` merges the struct's validity)."""
    return values.flatten()[values.type.get_field_index(name)]


def _view_families(table: pa.Table | pa.RecordBatch) -> Iterator[tuple[np.ndarray, pa.Array]]:
    """(row of each view, the views' texts) of ``table``'s conversation columns, one family of views at a time:
    every turn, question-answer pairs, whole conversations, question turns alone."""
    names = {name for name in MESSAGE_COLUMNS if _conversation_column(table, name, ("role", "content"))}
    if _conversation_column(table, STEPS_COLUMN, ("observation", "action")):
        names.add(STEPS_COLUMN)
    turns: list[tuple[np.ndarray, np.ndarray, pa.Array]] = []  # (conversation, is answer, text) of each turn
    rows = table.num_rows
    if "messages" in names:
        turns.append(_message_turns(_column(table, "messages"), np.arange(rows)))
    if "chosen" in names or "rejected" in names:  # conversations rows + i (with chosen), 2 rows + i (rejected)
        prompt = _message_turns(_column(table, "prompt"), np.arange(rows)) if "prompt" in names else None
        for offset, reply in ((rows, "chosen"), (2 * rows, "rejected")):
            if reply in names:
                if prompt is not None:
                    turns.append((prompt[0] + offset, prompt[1], prompt[2]))
                turns.append(_message_turns(_column(table, reply), np.arange(rows) + offset))
    if STEPS_COLUMN in names:
        turns.append(_step_turns(_column(table, STEPS_COLUMN), np.arange(rows) + 3 * rows))
    turns = [t for t in turns if len(t[2])]
    if not turns:
        return
    conversation = np.concatenate([t[0] for t in turns])
    answer = np.concatenate([t[1] for t in turns])
    text = pa.concat_arrays([t[2].cast(pa.large_string()) for t in turns])
    # stable by conversation: a conversation's turns keep their order (a preference's prompt before its reply)
    order = np.argsort(conversation, kind="stable")
    conversation, answer, text = conversation[order], answer[order], text.take(pa.array(order))
    del turns
    yield conversation % rows, text  # every turn alone
    pair = np.flatnonzero((~answer[:-1]) & answer[1:] & (conversation[:-1] == conversation[1:]))
    if len(pair):  # a question turn and the answer turn right after it
        yield conversation[pair] % rows, pc.binary_join_element_wise(
            text.take(pa.array(pair)), text.take(pa.array(pair + 1)), pa.scalar("\n", pa.large_string()))
    # the whole conversation: its question turns, then its answer turns, one per line (as the registry joins them)
    grouped = np.lexsort((np.arange(len(conversation)), answer, conversation))
    starts = np.flatnonzero(np.concatenate([[True], conversation[grouped][1:] != conversation[grouped][:-1]]))
    offsets = np.concatenate([starts, [len(grouped)]]).astype(np.int64)
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets), text.take(pa.array(grouped))),
                            pa.scalar("\n", pa.large_string()))
    yield conversation[grouped][starts] % rows, joined.cast(pa.large_string())
    del joined
    # its question turns alone (an item registered without answers: MT-Bench's ``turns``), where it has answers
    questions = grouped[~answer[grouped]]
    answered = np.unique(conversation[answer])
    questions = questions[np.isin(conversation[questions], answered)]
    if len(questions):
        starts = np.flatnonzero(np.concatenate([[True], conversation[questions][1:] != conversation[questions][:-1]]))
        offsets = np.concatenate([starts, [len(questions)]]).astype(np.int64)
        yield conversation[questions][starts] % rows, pc.binary_join(
            pa.LargeListArray.from_arrays(pa.array(offsets), text.take(pa.array(questions))),
            pa.scalar("\n", pa.large_string())).cast(pa.large_string())


def _kept(conversation: np.ndarray, answer: np.ndarray, text: pa.Array, keep: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """The turns where ``keep`` and the text has a non-space character (the registry drops blank turns)."""
    blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(pc.fill_null(text, "")), ""), True)
    keep = keep & ~np.asarray(blank.to_numpy(zero_copy_only=False), dtype=bool)
    return conversation[keep], answer[keep], text.filter(pa.array(keep))


def _message_turns(messages: pa.Array, conversations: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(conversation, is answer, content) of every turn of a ``list<MESSAGE>`` column (row i: ``conversations[i]``);
    ``SKIPPED_ROLES`` left out."""
    flat = pc.list_flatten(messages)
    parents = np.asarray(pc.list_parent_indices(messages).to_numpy(zero_copy_only=False), dtype=np.int64)
    if not len(flat):
        return np.empty(0, np.int64), np.empty(0, bool), pa.array([], pa.string())
    roles = pc.utf8_lower(pc.fill_null(_field(flat, "role").cast(pa.string()), ""))
    answer = np.asarray(pc.is_in(roles, value_set=pa.array(sorted(ANSWER_ROLES))).to_numpy(zero_copy_only=False),
                        dtype=bool)
    skipped = np.asarray(pc.is_in(roles, value_set=pa.array(sorted(SKIPPED_ROLES))).to_numpy(zero_copy_only=False),
                         dtype=bool)
    return _kept(conversations[parents], answer, _field(flat, "content").cast(pa.string()), ~skipped)


def _step_turns(steps: pa.Array, conversations: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(conversation, is answer, text) of every step's observation (a question) and action (its answer), in step
    order."""
    flat = pc.list_flatten(steps)
    parents = np.asarray(pc.list_parent_indices(steps).to_numpy(zero_copy_only=False), dtype=np.int64)
    if not len(flat):
        return np.empty(0, np.int64), np.empty(0, bool), pa.array([], pa.string())
    n = len(flat)
    text = pa.concat_arrays([_field(flat, "observation").cast(pa.string()), _field(flat, "action").cast(pa.string())])
    order = np.empty(2 * n, np.int64)
    order[0::2], order[1::2] = np.arange(n), np.arange(n) + n  # observation then action, step by step
    text = text.take(pa.array(order))
    answer = np.tile(np.array([False, True]), n)
    return _kept(np.repeat(conversations[parents], 2), answer, text, np.ones(2 * n, dtype=bool))

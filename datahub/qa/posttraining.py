"""Derived validation columns of the post-training kinds (``datahub.kinds.posttraining``), computed per batch.

Suites name flat columns; ``messages``, ``chosen``/``rejected`` and ``steps`` are lists of structs, so each batch
of them becomes the flat columns below with Arrow kernels (per-row counts are a ``bincount`` over each message's or
step's row; no Python loop per row), in the same streamed pass and the same bounded memory as ``text_length``, on
one machine and in the engines' tasks alike (``datahub.qa.validate.validation_batch``). A column exists when the
table has its sources (a text-only table has none of them).

- ``messages_turns`` (int64, from ``messages``): messages in the conversation.
- ``messages_assistant_turns`` (int64, ``messages``): messages with role ``assistant`` (what SFT trains on).
- ``messages_empty_turns`` (int64, ``messages``): messages of any role that are empty: content empty after trimming
  whitespace (or null) and no tool call (``tool_calls`` null, blank or ``[]``). Counts legitimate turns too (an empty
  system prompt in ShareGPT exports, a tool that printed nothing), so it is for users' own suites.
- ``messages_empty_assistant_turns`` (int64, ``messages``): the empty messages of role ``assistant`` (what SFT trains
  on: an empty one teaches the model to say nothing); ``posttraining.v1`` gates on this one.
- ``messages_last_role`` (string, ``messages``): role of the last message (null for an empty list).
- ``chosen_turns``, ``rejected_turns`` (int64, ``chosen``, ``rejected``): messages in the reply.
- ``chosen_empty_turns``, ``rejected_empty_turns`` (int64): empty messages of the reply, as ``messages_empty_turns``.
- ``chosen_equals_rejected`` (bool, ``chosen`` and ``rejected``): both replies hold the same messages: as many, and
  each with the same role, content and tool calls after trimming whitespace (``preference_quality``'s
  ``identical_pair`` compares the same trimmed contents).
- ``steps_count`` (int64, ``steps``): steps in the row (one segment of at most ``MAX_STEPS_PER_ROW``).
- ``steps_reward_nulls`` (int64, ``steps``): steps without a reward.
- ``steps_within_episode`` (bool, ``steps``, ``step_offset``, ``episode_steps``): the segment lies inside its
  episode: ``0 <= step_offset`` and ``step_offset + steps_count <= episode_steps`` (false when either is null).

A source column of another type (``steps`` a count, ``messages`` JSON text: a table from another writer) is no
source: no derived column reads it (``mistyped_sources``, ``SOURCE_TYPES``), ``datahub qa`` does not run
``posttraining.v1`` on it by default, and a suite naming a column derived from it fails that expectation with the
column, its type and the type needed.

A row whose ``kind`` column names the derived column's kind is judged even when its list column is null (a broken
operator or merge wrote null instead of a list): the null list counts as an empty one (``messages_assistant_turns``,
``rejected_turns``, ``steps_count`` are then 0 and fail ``posttraining.v1``). So the derived columns read ``kind``
when the table has it (``KIND_COLUMN``).

``document_lengths`` gives ``samples.v1`` its ``document_length`` (``datahub.qa.validate``): ``text_length`` on
document rows, null on rows of ``POSTTRAINING_KINDS``, whose ``text`` renders a whole conversation or up to 1,024
steps (an agent rollout with terminal output runs to millions of characters), so the 1,000,000-character document
bound does not judge them. posttraining.v1 sets no length bound of its own: ingest's ``limits.max_record_bytes`` already
bounds a record per job (1 MB by default, 20 MB in jobs/trajectory-demo.yaml), and a constant here would contradict
a job that raised it.

On a row of another kind the source column is null, and so is every derived value. Great Expectations' column-map
expectations (``expect_column_values_to_be_between``, ``..._to_be_in_set``) judge non-null values only, so in a table
that mixes kinds each check sees the rows of its own kind: ``schemas/gx/posttraining.v1.json`` needs no ``mostly``
for that, and marks every expectation ``meta.optional`` so a table without that kind's columns skips it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Derived:
    """One derived validation column: the table columns it reads and how a batch becomes its values."""

    name: str
    kind: str  # the sample kind whose columns it reads
    sources: tuple[str, ...]
    type: pa.DataType
    compute: Callable[[_Batch], pa.Array]


DERIVED: dict[str, Derived] = {}
KIND_COLUMN = "kind"
# the sample kind whose rows carry each list column (datahub.kinds.posttraining)
LIST_KINDS = {"messages": "chat", "chosen": "preference", "rejected": "preference", "steps": "trajectory"}
# the kinds whose ``text`` is a rendering of their list column, not a document (``document_lengths``)
POSTTRAINING_KINDS: tuple[str, ...] = tuple(sorted(set(LIST_KINDS.values())))
_Compute = Callable[["_Batch"], pa.Array]


def _derive(name: str, kind: str, sources: tuple[str, ...], type_: pa.DataType) -> Callable[[_Compute], _Compute]:
    def register(compute: _Compute) -> _Compute:
        if name in DERIVED:
            raise ValueError(f"derived validation column {name!r} is defined twice")
        DERIVED[name] = Derived(name, kind, sources, type_, compute)
        return compute

    return register


def _is_text(type_: pa.DataType) -> bool:
    return pa.types.is_string(type_) or pa.types.is_large_string(type_)


def _list_of_struct_with(fields: dict[str, Callable[[pa.DataType], bool]]) -> Callable[[pa.DataType], bool]:
    def fits(type_: pa.DataType) -> bool:
        if not (pa.types.is_list(type_) or pa.types.is_large_list(type_)) or not pa.types.is_struct(type_.value_type):
            return False
        struct = type_.value_type
        return all(struct.get_field_index(name) >= 0 and check(struct.field(name).type) for name, check in fields.items())

    return fits


_MESSAGES = ("a list of structs with string fields role, content, tool_calls (datahub.kinds.posttraining.MESSAGES)",
             _list_of_struct_with({"role": _is_text, "content": _is_text, "tool_calls": _is_text}))
_INTEGER = ("an integer", pa.types.is_integer)
# what each source column must be for the derived columns to read it: (description, predicate on its Arrow type)
SOURCE_TYPES: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "messages": _MESSAGES, "chosen": _MESSAGES, "rejected": _MESSAGES,
    "steps": ("a list of structs with a reward field (datahub.kinds.posttraining.STEPS)",
              _list_of_struct_with({"reward": lambda type_: True})),
    "step_offset": _INTEGER, "episode_steps": _INTEGER,
}


def mistyped_sources(schema: pa.Schema) -> dict[str, str]:
    """Source columns the table has with a type the derived columns cannot read (a table from another writer whose
    ``steps`` is a count, or ``messages`` JSON text) -> what is wrong: ``column 'steps' is int64, not ...``. No
    derived column reads them, and ``datahub qa`` does not pick ``posttraining.v1`` for them."""
    wrong = {}
    for field_ in schema:
        if field_.name in SOURCE_TYPES:
            expected, fits = SOURCE_TYPES[field_.name]
            if not fits(field_.type):
                wrong[field_.name] = f"column {field_.name!r} is {field_.type}, not {expected}"
    return wrong


def judged_by_kind(schema: pa.Schema) -> bool:
    """The table has a text ``kind`` column: its rows of a kind are judged when their list column is null."""
    return KIND_COLUMN in schema.names and _is_text(schema.field(KIND_COLUMN).type)


def document_lengths(table: pa.Table, lengths: pa.Array) -> pa.Array:
    """``lengths`` (of the batch's ``text``) on document rows, null on rows of a ``POSTTRAINING_KINDS`` kind (by a
    text ``kind`` column; a null kind, another kind, or no such column: a document, as ``datahub.kinds`` reads it).
    ``datahub.qa.validate`` names it ``document_length``: samples.v1 bounds documents' length, not a rendered chat
    or a 1,024-step trajectory's."""
    if not judged_by_kind(table.schema):
        return lengths
    kinds = table.column(KIND_COLUMN).combine_chunks()
    rendered = pc.is_in(kinds, value_set=pa.array(POSTTRAINING_KINDS, kinds.type))  # a null kind: false
    return pc.if_else(rendered, pa.scalar(None, lengths.type), lengths)


def derived_columns(schema: pa.Schema) -> list[Derived]:
    """The derived columns a table of ``schema`` can give (all their sources present, each of the type read)."""
    present = set(schema.names) - set(mistyped_sources(schema))
    return [d for d in DERIVED.values() if set(d.sources) <= present]


def compute_derived(table: pa.Table, wanted: set[str] | None = None) -> dict[str, pa.Array]:
    """The derived columns of one batch that its columns can give (only the ``wanted`` ones when given); each
    list column is flattened once per batch, whatever number of columns read it."""
    batch = _Batch(table)
    return {d.name: d.compute(batch) for d in derived_columns(table.schema) if wanted is None or d.name in wanted}


@dataclass(frozen=True)
class _Lists:
    """A ``list<struct>`` column of a batch flattened: its values and, per value, the row it belongs to."""

    rows: int
    values: pa.StructArray
    parent: np.ndarray  # int64, the row of each value
    lengths: np.ndarray  # int64 per row (0 for a null list)
    valid: np.ndarray  # bool per row: the list is not null

    def field(self, name: str) -> pa.Array:
        return pc.struct_field(self.values, name)

    def per_row(self, mask: np.ndarray) -> pa.Array:
        """How many values of each row have ``mask`` true; null on null lists."""
        counts = np.bincount(self.parent[mask], minlength=self.rows).astype(np.int64)
        return pa.array(counts, pa.int64(), mask=~self.valid)


class _Batch:
    """One batch and its list columns, flattened on first use."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._flat: dict[str, _Lists] = {}

    def lists(self, name: str) -> _Lists:
        """``name`` flattened; a null list on a row whose ``kind`` is the column's kind counts as empty."""
        if name not in self._flat:
            lists = _lists(self.table.column(name))
            if judged_by_kind(self.table.schema):
                mine = _bools(pc.equal(self.table.column(KIND_COLUMN), LIST_KINDS[name]))
                lists = replace(lists, valid=lists.valid | mine)
            self._flat[name] = lists
        return self._flat[name]


def _lists(column: pa.Array | pa.ChunkedArray) -> _Lists:
    lists = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    valid = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    values = lists.flatten()  # the values of the non-null lists, in row order
    parent = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)
    return _Lists(len(lists), values, parent, lengths, valid)


def _bools(array: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)


def _trimmed(array: pa.Array) -> pa.Array:
    """A string field with nulls as empty strings, whitespace trimmed."""
    return pc.utf8_trim_whitespace(pc.fill_null(array, ""))


def _calls(array: pa.Array) -> pa.Array:
    """``tool_calls`` with no call (null, blank, ``[]``) as the empty string."""
    trimmed = _trimmed(array)
    return pc.if_else(pc.equal(trimmed, "[]"), "", trimmed)


def _empty_messages(lists: _Lists) -> np.ndarray:
    """Per message: content empty after trimming and no tool call."""
    content = lists.field("content")  # blank: null, empty or all whitespace (no trimmed copy of every content)
    blank = ~_bools(pc.greater(pc.binary_length(content), 0)) | _bools(pc.utf8_is_space(content))
    return blank & _bools(pc.equal(_calls(lists.field("tool_calls")), ""))


@_derive("messages_turns", "chat", ("messages",), pa.int64())
def messages_turns(batch: _Batch) -> pa.Array:
    lists = batch.lists("messages")
    return pa.array(lists.lengths, pa.int64(), mask=~lists.valid)


@_derive("messages_assistant_turns", "chat", ("messages",), pa.int64())
def messages_assistant_turns(batch: _Batch) -> pa.Array:
    lists = batch.lists("messages")
    return lists.per_row(_bools(pc.equal(lists.field("role"), "assistant")))


@_derive("messages_empty_turns", "chat", ("messages",), pa.int64())
def messages_empty_turns(batch: _Batch) -> pa.Array:
    lists = batch.lists("messages")
    return lists.per_row(_empty_messages(lists))


@_derive("messages_empty_assistant_turns", "chat", ("messages",), pa.int64())
def messages_empty_assistant_turns(batch: _Batch) -> pa.Array:
    lists = batch.lists("messages")
    return lists.per_row(_empty_messages(lists) & _bools(pc.equal(lists.field("role"), "assistant")))


@_derive("messages_last_role", "chat", ("messages",), pa.string())
def messages_last_role(batch: _Batch) -> pa.Array:
    lists = batch.lists("messages")
    last = np.cumsum(lists.lengths) - 1
    has = lists.valid & (lists.lengths > 0)
    return pc.take(lists.field("role"), pa.array(np.where(has, last, 0), pa.int64(), mask=~has))


def _turns(side: str) -> _Compute:
    def turns(batch: _Batch) -> pa.Array:
        lists = batch.lists(side)
        return pa.array(lists.lengths, pa.int64(), mask=~lists.valid)

    return turns


def _empty_turns(side: str) -> _Compute:
    def empty(batch: _Batch) -> pa.Array:
        lists = batch.lists(side)
        return lists.per_row(_empty_messages(lists))

    return empty


for _side in ("chosen", "rejected"):
    _derive(f"{_side}_turns", "preference", (_side,), pa.int64())(_turns(_side))
    _derive(f"{_side}_empty_turns", "preference", (_side,), pa.int64())(_empty_turns(_side))


@_derive("chosen_equals_rejected", "preference", ("chosen", "rejected"), pa.bool_())
def chosen_equals_rejected(batch: _Batch) -> pa.Array:
    chosen, rejected = batch.lists("chosen"), batch.lists("rejected")
    valid = chosen.valid & rejected.valid
    same_length = valid & (chosen.lengths == rejected.lengths)
    equal = np.zeros(chosen.rows, dtype=bool)
    rows = np.flatnonzero(same_length)
    if len(rows):
        # the rows of equal length, flattened on both sides, line up message by message
        picked = pa.array(rows, pa.int64())
        mine = _lists(pc.take(batch.table.column("chosen"), picked))
        theirs = _lists(pc.take(batch.table.column("rejected"), picked))
        same = (_bools(pc.equal(pc.fill_null(mine.field("role"), ""), pc.fill_null(theirs.field("role"), "")))
                & _bools(pc.equal(_trimmed(mine.field("content")), _trimmed(theirs.field("content"))))
                & _bools(pc.equal(_calls(mine.field("tool_calls")), _calls(theirs.field("tool_calls")))))
        differing = np.bincount(mine.parent[~same], minlength=len(rows))
        equal[rows] = differing == 0
    return pa.array(equal, pa.bool_(), mask=~valid)


@_derive("steps_count", "trajectory", ("steps",), pa.int64())
def steps_count(batch: _Batch) -> pa.Array:
    lists = batch.lists("steps")
    return pa.array(lists.lengths, pa.int64(), mask=~lists.valid)


@_derive("steps_reward_nulls", "trajectory", ("steps",), pa.int64())
def steps_reward_nulls(batch: _Batch) -> pa.Array:
    lists = batch.lists("steps")
    return lists.per_row(_bools(pc.is_null(lists.field("reward"))))


@_derive("steps_within_episode", "trajectory", ("steps", "step_offset", "episode_steps"), pa.bool_())
def steps_within_episode(batch: _Batch) -> pa.Array:
    lists = batch.lists("steps")
    offset = pc.cast(batch.table.column("step_offset"), pa.int64())
    episode = pc.cast(batch.table.column("episode_steps"), pa.int64())
    end = pc.add(offset, pa.array(lists.lengths, pa.int64()))
    inside = _bools(pc.and_(pc.greater_equal(offset, 0), pc.less_equal(end, episode)))
    return pa.array(inside, pa.bool_(), mask=~lists.valid)

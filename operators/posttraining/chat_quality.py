"""``chat_quality``: per-turn checks of conversations; drops the broken ones and records signals per sample.

Checks (each a drop reason, in this order; the signal is kept in ``quality`` either way):

- ``too_few_turns`` / ``too_many_turns``: non-system messages outside ``[min_turns, max_turns]``
  (``quality.chat_turns``);
- ``role_order``: a system message after the first position, a conversation opening with an assistant or tool
  message, the same user/assistant role twice in a row, a tool message not answering an assistant tool call
  (``quality.chat_role_errors``);
- ``empty_assistant_turn``: an assistant message with no content and no tool calls (``quality.chat_empty_assistant``);
- ``empty_user_turn``: a user message with no content (only whitespace): the reply answers nothing
  (``quality.chat_empty_user``);
- ``invalid_tool_call_json``: a tool call whose ``arguments`` string does not parse as JSON
  (``quality.chat_bad_tool_calls``);
- ``unanswered_tool_call``: an assistant message's tool calls outnumber the tool messages right after it, or (calls
  and replies both carrying ids) a call's id is answered by none of them: a call whose result never came; a
  conversation may end on its calls (a function-calling target) (``quality.chat_unanswered_tool_calls``);
- ``truncated_assistant_turn``: the conversation ends with an assistant message cut off mid-sentence: an
  unclosed ```` ``` ```` fence, or at least ``truncation_min_chars`` characters ending in a letter, a comma or a
  hyphen (our heuristic; a reply ending in a command or number is not flagged) (``quality.chat_truncated``).

Messages are checked as flat Arrow arrays (``operators.posttraining.messages``); only the tool-call JSON is
parsed in Python, for the messages that carry tool calls.
"""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import BatchOperator, Operator, Params, add_quality_signals, register
from operators.posttraining.messages import Flat, as_bool, flatten, strings

SYSTEM, USER, ASSISTANT, TOOL = 0, 1, 2, 3
_ROLES = pa.array(["system", "user", "assistant", "tool"])


class ChatQualityParams(Params):
    min_turns: int = Field(2, ge=0, description="fewest non-system messages")
    max_turns: int | None = Field(None, ge=1, description="most non-system messages (None: no limit)")
    drop_role_errors: bool = True
    drop_empty_assistant: bool = True
    drop_empty_user: bool = True
    drop_invalid_tool_calls: bool = True
    drop_unanswered_tool_calls: bool = True
    drop_truncated: bool = True
    truncation_min_chars: int = Field(40, ge=1)


def role_codes(flat: Flat) -> np.ndarray:
    codes = pc.index_in(flat.field("role"), value_set=_ROLES)
    return np.asarray(pc.fill_null(codes, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def role_errors(flat: Flat, roles: np.ndarray) -> np.ndarray:
    """Role-order errors per row (see the module docstring)."""
    previous = flat.previous(roles, -1)
    has_calls = as_bool(pc.is_valid(flat.field("tool_calls")))
    previous_calls = flat.previous(has_calls, False)
    first_real = (flat.position == 0) | ((flat.position == 1) & (previous == SYSTEM))
    bad = (roles == SYSTEM) & (flat.position > 0)
    bad |= first_real & ((roles == ASSISTANT) | (roles == TOOL))
    bad |= (roles == previous) & ((roles == USER) | (roles == ASSISTANT))
    bad |= (roles == TOOL) & ~(((previous == ASSISTANT) & previous_calls) | (previous == TOOL))
    bad |= roles < 0
    return flat.per_row(bad)


def bad_tool_calls(flat: Flat) -> np.ndarray:
    """Tool calls per row whose ``arguments`` (or ``function.arguments``) string is not JSON."""
    calls = flat.field("tool_calls")
    where = np.flatnonzero(as_bool(pc.is_valid(calls)))
    bad = np.zeros(len(calls), dtype=bool)
    for i, text in zip(where, calls.take(pa.array(where, pa.int64())).to_pylist()):
        bad[i] = not _calls_parse(text)
    return flat.per_row(bad)


def unanswered_tool_calls(flat: Flat, roles: np.ndarray) -> np.ndarray:
    """Per row, the assistant messages whose tool calls are more than the tool messages right after them.

    The row's last message is exempt: a conversation that ends on its calls teaches the call, not its result.
    Only the messages with tool calls are looked at in Python (their JSON is parsed to count the calls).
    """
    calls = flat.field("tool_calls")
    where = np.flatnonzero(as_bool(pc.is_valid(calls)) & (roles == ASSISTANT))
    unanswered = np.zeros(len(calls), dtype=bool)
    is_tool = roles == TOOL
    reply_ids = flat.field("tool_call_id")
    for i, text in zip(where, calls.take(pa.array(where, pa.int64())).to_pylist()):
        end = int(flat.offsets[flat.parent[i] + 1])
        if i == end - 1:
            continue
        replies = 0
        while i + 1 + replies < end and is_tool[i + 1 + replies]:
            replies += 1
        call_ids = _call_ids(text)
        answered = reply_ids.slice(i + 1, replies).to_pylist()
        # ids on both sides (OpenAI layout): every call's id must be answered; without ids, the count decides
        if replies < len(call_ids):
            unanswered[i] = True
        elif all(call_ids) and all(answered) and set(call_ids) - set(answered):
            unanswered[i] = True
    return flat.per_row(unanswered)


def _call_ids(text: str) -> list[str | None]:
    """One entry per call of a message: its ``id`` (None when it has none, or the JSON does not parse)."""
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return [None]
    calls = calls if isinstance(calls, list) else [calls]
    return [c.get("id") if isinstance(c, dict) and isinstance(c.get("id"), str) else None for c in calls]


def _calls_parse(text: str) -> bool:
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return False
    for call in calls if isinstance(calls, list) else [calls]:
        if not isinstance(call, dict):
            return False
        function = call.get("function")
        arguments = (function if isinstance(function, dict) else call).get("arguments")
        if isinstance(arguments, str):
            try:
                json.loads(arguments)
            except json.JSONDecodeError:
                return False
    return True


def truncated(flat: Flat, roles: np.ndarray, min_chars: int) -> np.ndarray:
    last = flat.last()
    out = np.zeros(flat.rows, dtype=bool)
    rows = np.flatnonzero(last >= 0)
    if not len(rows):
        return out
    final = last[rows]
    content = pc.utf8_rtrim_whitespace(strings(flat.field("content").take(pa.array(final))))
    open_fence = np.asarray(pc.count_substring(content, "```").to_numpy(zero_copy_only=False)) % 2 == 1
    mid_sentence = as_bool(pc.match_substring_regex(content, r"[\p{L},\-]$")) & (
        np.asarray(pc.utf8_length(content).to_numpy(zero_copy_only=False)) >= min_chars)
    out[rows] = (roles[final] == ASSISTANT) & (open_fence | mid_sentence)
    return out


@register
class ChatQuality(BatchOperator[ChatQualityParams]):
    """Per-turn checks of ``chat`` samples: turns, role order, empty turns, tool-call JSON and results, truncation."""

    name = "chat_quality"
    version = "2"  # 2: empty_user_turn, unanswered_tool_call (by count, and by id where both sides carry ids)
    Params = ChatQualityParams
    params: ChatQualityParams
    annotates = True
    kinds: ClassVar[frozenset[str]] = frozenset({"chat"})

    def process(self, table: pa.Table) -> pa.Table:
        p = self.params
        flat = flatten(table.column("messages"))
        roles = role_codes(flat)
        turns = flat.per_row(roles != SYSTEM)
        errors = role_errors(flat, roles)
        empty = flat.per_row((roles == ASSISTANT) & as_bool(pc.equal(pc.utf8_trim_whitespace(strings(flat.field("content"))), ""))
                             & ~as_bool(pc.is_valid(flat.field("tool_calls"))))
        empty_user = flat.per_row((roles == USER) & as_bool(pc.equal(pc.utf8_trim_whitespace(strings(flat.field("content"))), "")))
        bad_calls = bad_tool_calls(flat)
        unanswered = unanswered_tool_calls(flat, roles)
        cut = truncated(flat, roles, p.truncation_min_chars)
        checks = [
            ("too_few_turns", turns < p.min_turns),
            ("too_many_turns", turns > p.max_turns if p.max_turns is not None else np.zeros(flat.rows, bool)),
            ("role_order", (errors > 0) & p.drop_role_errors),
            ("empty_assistant_turn", (empty > 0) & p.drop_empty_assistant),
            ("empty_user_turn", (empty_user > 0) & p.drop_empty_user),
            ("invalid_tool_call_json", (bad_calls > 0) & p.drop_invalid_tool_calls),
            ("unanswered_tool_call", (unanswered > 0) & p.drop_unanswered_tool_calls),
            ("truncated_assistant_turn", cut & p.drop_truncated),
        ]
        table = add_quality_signals(table, {"chat_turns": pa.array(turns), "chat_role_errors": pa.array(errors),
                                            "chat_empty_assistant": pa.array(empty), "chat_empty_user": pa.array(empty_user),
                                            "chat_bad_tool_calls": pa.array(bad_calls),
                                            "chat_unanswered_tool_calls": pa.array(unanswered),
                                            "chat_truncated": pa.array(cut)})
        return drop_first(table, checks)


def drop_first(table: pa.Table, checks: list[tuple[str, np.ndarray]]) -> pa.Table:
    """Mark each row dropped with the first failed check's reason."""
    reason = np.full(table.num_rows, None, dtype=object)
    for name, failed in reversed(checks):
        reason[np.asarray(failed, dtype=bool)] = name
    mask = pa.array(reason != None)  # noqa: E711 - elementwise on an object array
    if not pc.any(mask).as_py():
        return table
    return Operator.mark_dropped(table, mask, pa.array(reason.tolist(), pa.string()))

"""The post-training kinds ``chat``, ``preference`` and ``trajectory``: typed, nullable Arrow columns.

Columns (null on rows of other kinds):

- ``chat``: ``messages`` (list of ``MESSAGE``: ``role``, ``content``, ``name``, ``tool_calls``, ``tool_call_id``)
  and ``tools`` (the tool schemas offered, JSON text, or null).
- ``preference``: ``prompt``, ``chosen``, ``rejected`` (each a list of ``MESSAGE``; a plain-string prompt is one
  ``user`` message, a plain-string answer one ``assistant`` message) and ``chosen_score``, ``rejected_score``.
- ``trajectory``: ``episode_id``, ``steps`` (list of ``STEP``: ``observation``, ``action``, ``tool_call``,
  ``tool_result``, ``reward``, ``done``), ``step_offset`` (index of the row's first step in its episode) and
  ``episode_steps`` (the episode's length).

``MESSAGE.tool_calls`` and ``STEP.tool_call`` are JSON text (canonical: ``json.dumps(..., sort_keys=True)``):
tool arguments are arbitrary JSON, and operators that read them parse them (``operators/posttraining``).

Bounding long trajectories: a row holds at most ``MAX_STEPS_PER_ROW`` steps. Readers split a longer episode into
consecutive rows (segments) of the same ``episode_id`` with increasing ``step_offset``, so no batch holds a
10k-step episode whole; the loader's ``replay_steps`` reassembles any step range from the segments.

``text`` (what text operators see) is the canonical rendering (``render_messages``, ``render_preference``,
``render_steps``): one block per message, ``<|ROLE|>`` (``<|ROLE:NAME|>`` with a name) on its own line, then
the content; a message's tool calls follow as ``<|tool_calls|>`` and their JSON; a tool reply's id as
``<|tool_call_id|>`` and the id. Blocks are joined by a newline. A preference renders its prompt, then
``<|chosen|>`` and the chosen reply, then ``<|rejected|>`` and the rejected one. A trajectory step renders as
``<|step N|>`` (N = step index in the episode) then ``<|observation|>``, ``<|action|>``, ``<|tool_call|>``,
``<|tool_result|>`` and ``<|reward|>`` blocks for the parts present (``done`` as ``<|done|>``).

``sample_id`` = lowercase hex of xxh3-128 over the kind's name, one ``0x00`` byte and the identity-normalized
canonical rendering (``datahub.sample_id.identity_normalize``). Two conversations with the same prompt and
different answers are two samples; a text document with the same characters is another sample again. A segment of
an episode stored in several rows also hashes its episode's digest (``episode_digest``: xxh3-128 of the episode's
segment renderings joined by newlines; the reader hands it over and it is not stored): kind, 0x00, ``episode``, the
digest, 0x00 and the rendering. So two episodes sharing their first 1,024 steps are different samples, a repeated
episode is the same, an episode of one row keeps the id above, and ``text`` stays the plain rendering (text-based
dedup sees two equal segments of different episodes as equal texts).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from datahub.kinds.base import KindSpec, register_kind
from datahub.sample_id import sample_ids

MESSAGE = pa.struct([
    pa.field("role", pa.string()),
    pa.field("content", pa.string()),
    pa.field("name", pa.string()),
    pa.field("tool_calls", pa.string()),  # JSON list of calls, canonical
    pa.field("tool_call_id", pa.string()),
])
MESSAGES = pa.list_(MESSAGE)
STEP = pa.struct([
    pa.field("observation", pa.string()),
    pa.field("action", pa.string()),
    pa.field("tool_call", pa.string()),  # JSON, canonical
    pa.field("tool_result", pa.string()),
    pa.field("reward", pa.float64()),
    pa.field("done", pa.bool_()),
])
STEPS = pa.list_(STEP)
MAX_STEPS_PER_ROW = 1024
ROLES = ("system", "user", "assistant", "tool")

CHAT_FIELDS = (pa.field("messages", MESSAGES), pa.field("tools", pa.string()))
PREFERENCE_FIELDS = (pa.field("prompt", MESSAGES), pa.field("chosen", MESSAGES), pa.field("rejected", MESSAGES),
                     pa.field("chosen_score", pa.float64()), pa.field("rejected_score", pa.float64()))
TRAJECTORY_FIELDS = (pa.field("episode_id", pa.string()), pa.field("steps", STEPS),
                     pa.field("step_offset", pa.int64()), pa.field("episode_steps", pa.int64()))


def canonical_json(value: Any) -> str:
    """The one JSON text of a value (sorted keys, no ASCII escaping): what ``tool_calls`` columns hold."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def render_messages(messages: Sequence[Mapping[str, Any]]) -> str:
    """The canonical rendering of a message list (see the module docstring)."""
    blocks = []
    for m in messages:
        head = f"<|{m.get('role')}:{m['name']}|>" if m.get("name") else f"<|{m.get('role')}|>"
        block = f"{head}\n{m.get('content') or ''}"
        if m.get("tool_calls"):
            block += f"\n<|tool_calls|>\n{m['tool_calls']}"
        if m.get("tool_call_id"):
            block += f"\n<|tool_call_id|>\n{m['tool_call_id']}"
        blocks.append(block)
    return "\n".join(blocks)


def render_preference(prompt: Sequence[Mapping[str, Any]], chosen: Sequence[Mapping[str, Any]],
                      rejected: Sequence[Mapping[str, Any]]) -> str:
    parts = [render_messages(prompt)] if prompt else []
    parts += ["<|chosen|>", render_messages(chosen), "<|rejected|>", render_messages(rejected)]
    return "\n".join(parts)


def _number(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else str(value)


def render_steps(steps: Sequence[Mapping[str, Any]], *, step_offset: int = 0) -> str:
    blocks = []
    for i, s in enumerate(steps):
        block = [f"<|step {step_offset + i}|>"]
        for part in ("observation", "action", "tool_call", "tool_result"):
            if s.get(part) is not None:
                block.append(f"<|{part}|>\n{s[part]}")
        if s.get("reward") is not None:
            block.append(f"<|reward|> {_number(s['reward'])}")
        if s.get("done"):
            block.append("<|done|>")
        blocks.append("\n".join(block))
    return "\n".join(blocks)


EPISODE_DIGEST = "episode_digest"
TRAJECTORY_ID_FIELDS = (pa.field(EPISODE_DIGEST, pa.string()),)


def episode_digest(segment_texts: Sequence[str]) -> str:
    """What every segment of an episode stored in several rows adds to its ``sample_id`` (module docstring)."""
    return xxhash.xxh3_128_hexdigest("\n".join(segment_texts).encode("utf-8"))


def kind_sample_ids(kind: str, table: pa.Table) -> pa.Array:
    """``sample_id`` of every row: xxh3-128 of the kind, 0x00 and the identity-normalized rendering (``text``);
    with the episode's digest first where the table has an ``episode_digest`` for the row (module docstring)."""
    texts = table.column("text")
    digests = table.column(EPISODE_DIGEST) if EPISODE_DIGEST in table.column_names else None
    if digests is None or digests.null_count == len(digests):
        return sample_ids(pc.binary_join_element_wise(pa.scalar(kind + "\x00"), texts, ""))
    episode = pc.binary_join_element_wise(pa.scalar(kind + "\x00episode "), digests, pa.scalar("\x00"), texts, "")
    plain = pc.binary_join_element_wise(pa.scalar(kind + "\x00"), texts, "")
    return sample_ids(pc.if_else(pc.is_null(digests), plain, episode))


def _ids(kind: str) -> Any:
    def ids(table: pa.Table) -> pa.Array:
        return kind_sample_ids(kind, table)

    return ids


CHAT = register_kind(KindSpec(
    name="chat", fields=CHAT_FIELDS, sample_ids=_ids("chat"),
    description="a conversation (messages with roles, tool calls); text = canonical rendering; sample_id = xxh3-128 "
                "of 'chat', 0x00 and the identity-normalized rendering"))
PREFERENCE = register_kind(KindSpec(
    name="preference", fields=PREFERENCE_FIELDS, sample_ids=_ids("preference"),
    description="a prompt with a chosen and a rejected reply (DPO/RLHF pairs); text = canonical rendering"))
TRAJECTORY = register_kind(KindSpec(
    name="trajectory", fields=TRAJECTORY_FIELDS, sample_ids=_ids("trajectory"), id_fields=TRAJECTORY_ID_FIELDS,
    description=f"an agent episode's steps (observation, action, tool call/result, reward, done), at most "
                f"{MAX_STEPS_PER_ROW} steps per row (longer episodes are split in segments); text = canonical rendering"))

"""Preference readers: HF-style pair JSONL into ``preference`` samples.

Layouts: ``{"prompt": str | messages, "chosen": str | messages, "rejected": str | messages}`` with optional
``score_chosen`` / ``chosen_score`` and ``score_rejected`` / ``rejected_score``; chosen and rejected may be
whole conversations that begin with the prompt's messages (UltraFeedback-binarized), which are then taken off
each reply that repeats them. Without ``prompt``, ``chosen`` and ``rejected`` are whole conversations (message
lists, or Anthropic HH-RLHF transcripts ``"\n\nHuman: ...\n\nAssistant: ..."``) whose common leading messages
become the prompt; two that share none and begin with different questions (a user or system turn) answer different
prompts and are quarantined (``missing_field``), while two bare replies (plain strings, or assistant messages only:
reward-model data) are kept with an empty prompt. A string prompt is one user message, a string reply one
assistant message. A bad record is quarantined naming the field.
"""

from __future__ import annotations

import math
import re
from typing import Any

from datahub.kinds.posttraining import render_preference
from operators.ingest.base import register_reader
from operators.ingest.chat import JsonRecordsReader, RecordError, openai_message

_SCORES = {"chosen_score": ("score_chosen", "chosen_score", "chosen_rating"),
           "rejected_score": ("score_rejected", "rejected_score", "rejected_rating")}


def _turns(value: Any, field: str, role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value, "name": None, "tool_calls": None, "tool_call_id": None}]
    if isinstance(value, list) and value:
        return [openai_message(m, f"{field}[{i}]") for i, m in enumerate(value)]
    if value is None:
        raise RecordError("missing_field", f"no field {field!r} (a string or a list of messages)")
    raise RecordError("invalid_field", f"{field}: a {type(value).__name__}, expected a string or a non-empty list of messages")


_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")  # Anthropic HH-RLHF transcripts
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def _hh_transcript(value: Any) -> list[dict[str, Any]] | None:
    """The messages of an HH-RLHF transcript string, or None if ``value`` is not one."""
    if not isinstance(value, str) or not value.startswith("\n\nHuman: "):
        return None
    parts = _HH_TURN.split(value)  # ["", "Human", text, "Assistant", text, ...]
    return [{"role": _HH_ROLES[role], "content": text, "name": None, "tool_calls": None, "tool_call_id": None}
            for role, text in zip(parts[1::2], parts[2::2])]


def _score(record: dict[str, Any], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in record and record[name] is not None:
            value = record[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RecordError("invalid_field", f"{name}: {value!r} is not a finite number")
            return float(value)
    return None


@register_reader
class PreferenceJsonlReader(JsonRecordsReader):
    kinds = ("preference",)

    def parse(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        has_prompt = record.get("prompt") is not None
        hh_chosen = None if has_prompt else _hh_transcript(record.get("chosen"))
        hh_rejected = None if has_prompt else _hh_transcript(record.get("rejected"))
        if hh_chosen and hh_rejected:
            chosen, rejected = hh_chosen, hh_rejected
        else:
            chosen = _turns(record.get("chosen"), "chosen", "assistant")
            rejected = _turns(record.get("rejected"), "rejected", "assistant")
        if has_prompt:
            prompt = _turns(record["prompt"], "prompt", "user")
            n = len(prompt)  # whole conversations repeating the prompt: taken off each reply that does
            chosen = chosen[n:] if len(chosen) > n and chosen[:n] == prompt else chosen
            rejected = rejected[n:] if len(rejected) > n and rejected[:n] == prompt else rejected
        else:  # whole conversations: the shared leading messages are the prompt
            shared = 0
            while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
                shared += 1
            asks = chosen[0]["role"] != "assistant" or rejected[0]["role"] != "assistant"
            if shared == 0 and asks:  # bare replies (no question in either) are kept with an empty prompt
                raise RecordError("missing_field", "no field 'prompt', and chosen and rejected share no leading "
                                                   "message to take it from (a pair must answer the same prompt)")
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        fields = {"prompt": prompt, "chosen": chosen, "rejected": rejected,
                  **{column: _score(record, names) for column, names in _SCORES.items()}}
        used = {"prompt", "chosen", "rejected", *(n for names in _SCORES.values() for n in names)}
        meta = {k: v for k, v in record.items() if k not in used}
        return [(render_preference(prompt, chosen, rejected), fields, meta)]

"""Preference readers: HF-style pair JSONL into ``preference`` samples.

Layouts: ``{"prompt": str | messages, "chosen": str | messages, "rejected": str | messages}`` with optional
``score_chosen`` / ``chosen_score`` and ``score_rejected`` / ``rejected_score``; or, without ``prompt`` (the
Anthropic HH / UltraFeedback-binarized layout), ``chosen`` and ``rejected`` as whole conversations, whose
common leading messages become the prompt. A string prompt is one user message, a string reply one assistant
message. A bad record is quarantined naming the field.
"""

from __future__ import annotations

import math
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
        chosen = _turns(record.get("chosen"), "chosen", "assistant")
        rejected = _turns(record.get("rejected"), "rejected", "assistant")
        if record.get("prompt") is not None:
            prompt = _turns(record["prompt"], "prompt", "user")
        else:  # whole conversations: the shared leading messages are the prompt
            shared = 0
            while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
                shared += 1
            prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        fields = {"prompt": prompt, "chosen": chosen, "rejected": rejected,
                  **{column: _score(record, names) for column, names in _SCORES.items()}}
        used = {"prompt", "chosen", "rejected", *(n for names in _SCORES.values() for n in names)}
        meta = {k: v for k, v in record.items() if k not in used}
        return [(render_preference(prompt, chosen, rejected), fields, meta)]

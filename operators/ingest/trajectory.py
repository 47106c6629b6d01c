"""Trajectory readers: agent episodes as JSONL into ``trajectory`` samples.

Layout: ``{"episode_id"?: str, "steps": [{"observation"?, "action"?, "tool_call"?, "tool_result"?, "reward"?,
"done"?}, ...], ...}``; ``tool_call`` may be an object (kept as canonical JSON) or a string. An episode longer than
``MAX_STEPS_PER_ROW`` becomes several rows (segments, ``step_offset`` 0, 1024, ...), so a 10k-step episode never
fills one batch; each segment's sample id also hashes its episode's digest (``episode_digest``; the text stays the
plain rendering), so segments of two episodes that share 1,024 steps are not one sample. Without ``episode_id`` it
is null (``source_uri`` and ``source_offset`` name the episode). A bad step is
quarantined with its index and field (``steps[7].reward: 'high' is not a number``).
"""

from __future__ import annotations

import math
from typing import Any

from datahub.kinds.posttraining import MAX_STEPS_PER_ROW, canonical_json, episode_digest, render_steps
from operators.ingest.base import register_reader
from operators.ingest.chat import JsonRecordsReader, RecordError

_TEXT_PARTS = ("observation", "action", "tool_result")


def _step(step: Any, where: str) -> dict[str, Any]:
    if not isinstance(step, dict):
        raise RecordError("invalid_step", f"{where}: a {type(step).__name__}, expected an object")
    out: dict[str, Any] = {}
    for part in _TEXT_PARTS:
        value = step.get(part)
        if value is not None and not isinstance(value, str):
            value = canonical_json(value)  # structured observations (dicts of fields) are kept as JSON text
        out[part] = value
    call = step.get("tool_call")
    out["tool_call"] = call if call is None or isinstance(call, str) else canonical_json(call)
    reward = step.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)):
        raise RecordError("invalid_step", f"{where}.reward: {reward!r} is not a finite number")
    out["reward"] = None if reward is None else float(reward)
    done = step.get("done")
    if done is not None and not isinstance(done, bool):
        raise RecordError("invalid_step", f"{where}.done: {done!r} is not true or false")
    out["done"] = done
    if all(out[p] is None for p in (*_TEXT_PARTS, "tool_call")):
        raise RecordError("invalid_step", f"{where}: no observation, action, tool_call or tool_result")
    return out


@register_reader
class TrajectoryJsonlReader(JsonRecordsReader):
    kinds = ("trajectory",)
    steps_per_row = MAX_STEPS_PER_ROW

    def parse(self, record: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        raw_steps = record.get("steps")
        if raw_steps is None:
            raise RecordError("missing_field", f"no field 'steps' (a list of steps); the record has: "
                                               f"{', '.join(map(repr, sorted(record))) or 'nothing'}")
        if not isinstance(raw_steps, list) or not raw_steps:
            raise RecordError("invalid_field", f"steps: expected a non-empty list, got "
                                               f"{'an empty list' if raw_steps == [] else type(raw_steps).__name__}")
        steps = [_step(s, f"steps[{i}]") for i, s in enumerate(raw_steps)]
        episode = record.get("episode_id")
        if episode is not None and not isinstance(episode, (str, int)):
            raise RecordError("invalid_field", f"episode_id: a {type(episode).__name__}, expected a string")
        meta = {k: v for k, v in record.items() if k not in ("steps", "episode_id")}
        offsets = range(0, len(steps), self.steps_per_row)
        texts = [render_steps(steps[o:o + self.steps_per_row], step_offset=o) for o in offsets]
        # a segment's identity includes its episode's (datahub.kinds.posttraining); one row keeps its old id
        digest = episode_digest(texts) if len(texts) > 1 else None
        out = []
        for offset, text in zip(offsets, texts):
            fields = {"episode_id": None if episode is None else str(episode),
                      "steps": steps[offset:offset + self.steps_per_row], "step_offset": offset,
                      "episode_steps": len(steps), "episode_digest": digest}
            out.append((text, fields, meta))
        return out

"""``trajectory_quality``: tool calls that do not parse or get no result, and episodes outside a step range.

- ``invalid_tool_call_json``: a step's ``tool_call`` is not JSON (``quality.traj_bad_tool_calls``);
- ``unanswered_tool_call``: a step with a ``tool_call`` and no ``tool_result`` (``quality.traj_unanswered_tool_calls``
  is always recorded; rows are dropped only with ``drop_unanswered_tool_calls: true``, off by default because ReAct /
  SWE-agent data puts a tool's output in the next step's observation). Like ``invalid_tool_call_json`` it is decided
  per row: in an episode stored in several rows only the segment holding the step is dropped;
- ``too_few_steps`` / ``too_many_steps``: the episode's length (``episode_steps``, all segments) outside
  ``[min_steps, max_steps]`` (every segment of the episode is dropped alike).
"""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import BatchOperator, Params, add_quality_signals, register
from operators.posttraining.chat_quality import drop_first
from operators.posttraining.messages import as_bool, flatten


class TrajectoryQualityParams(Params):
    min_steps: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    drop_invalid_tool_calls: bool = True
    drop_unanswered_tool_calls: bool = False  # opt-in: ReAct-style episodes have no tool_result (module docstring)


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


@register
class TrajectoryQuality(BatchOperator[TrajectoryQualityParams]):
    """Unparseable tool calls and episode length bounds in ``trajectory`` samples."""

    name = "trajectory_quality"
    version = "2"  # 2: the traj_unanswered_tool_calls signal (unanswered_tool_call drops are opt-in)
    Params = TrajectoryQualityParams
    params: TrajectoryQualityParams
    annotates = True
    kinds: ClassVar[frozenset[str]] = frozenset({"trajectory"})

    def process(self, table: pa.Table) -> pa.Table:
        p = self.params
        flat = flatten(table.column("steps"))
        calls = flat.field("tool_call")
        where = np.flatnonzero(as_bool(pc.is_valid(calls)))
        bad = np.zeros(len(calls), dtype=bool)
        for i, text in zip(where, calls.take(pa.array(where, pa.int64())).to_pylist()):
            bad[i] = not _parses(text)
        bad_calls = flat.per_row(bad)
        unanswered = flat.per_row(as_bool(pc.is_valid(calls)) & ~as_bool(pc.is_valid(flat.field("tool_result"))))
        length = np.asarray(pc.fill_null(table.column("episode_steps"), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        table = add_quality_signals(table, {"traj_bad_tool_calls": pa.array(bad_calls),
                                            "traj_unanswered_tool_calls": pa.array(unanswered)})
        return drop_first(table, [
            ("too_few_steps", length < p.min_steps),
            ("too_many_steps", length > p.max_steps if p.max_steps is not None else np.zeros(len(length), bool)),
            ("invalid_tool_call_json", (bad_calls > 0) & p.drop_invalid_tool_calls),
            ("unanswered_tool_call", (unanswered > 0) & p.drop_unanswered_tool_calls),
        ])

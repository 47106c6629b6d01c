"""``preference_quality``: drop preference pairs that cannot teach a preference.

- ``empty_reply``: the chosen or the rejected reply has no content and no tool calls;
- ``identical_pair``: chosen and rejected are the same after trimming whitespace (``quality.pref_identical``);
- ``score_inverted``: both scores given and ``chosen_score - rejected_score < min_score_margin``
  (``quality.pref_score_margin``; off unless ``min_score_margin`` is set).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import BatchOperator, Params, add_quality_signals, register
from operators.posttraining.chat_quality import drop_first
from operators.posttraining.messages import as_bool, flatten, strings


class PreferenceQualityParams(Params):
    min_score_margin: float | None = Field(None, description="least chosen_score - rejected_score (None: not checked)")


def _reply_text(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """Each reply's contents (and tool calls) joined, and whether it has any."""
    flat = flatten(column)
    parts = pc.binary_join_element_wise(pc.utf8_trim_whitespace(strings(flat.field("content"))),
                                        pc.utf8_trim_whitespace(strings(flat.field("tool_calls"))), "\x00")
    lists = pa.ListArray.from_arrays(pa.array(flat.offsets.astype(np.int32)), parts)
    joined = pc.utf8_trim_whitespace(pc.binary_join(lists, "\x01"))
    has_any = flat.per_row(as_bool(pc.greater(pc.utf8_length(pc.utf8_trim(parts, "\x00 \n\t")), 0))) > 0
    return joined, has_any


@register
class PreferenceQuality(BatchOperator[PreferenceQualityParams]):
    """Empty or identical replies and inverted scores in ``preference`` samples."""

    name = "preference_quality"
    version = "1"
    Params = PreferenceQualityParams
    params: PreferenceQualityParams
    annotates = True
    kinds: ClassVar[frozenset[str]] = frozenset({"preference"})

    def process(self, table: pa.Table) -> pa.Table:
        chosen, chosen_any = _reply_text(table.column("chosen"))
        rejected, rejected_any = _reply_text(table.column("rejected"))
        identical = as_bool(pc.equal(chosen, rejected))
        margin = pc.subtract(table.column("chosen_score"), table.column("rejected_score"))
        inverted = np.zeros(table.num_rows, dtype=bool)
        if self.params.min_score_margin is not None:
            inverted = as_bool(pc.less(margin, self.params.min_score_margin))
        table = add_quality_signals(table, {"pref_identical": pa.array(identical),
                                            "pref_score_margin": margin.combine_chunks() if isinstance(margin, pa.ChunkedArray) else margin})
        return drop_first(table, [("empty_reply", ~(chosen_any & rejected_any)), ("identical_pair", identical),
                                  ("score_inverted", inverted)])

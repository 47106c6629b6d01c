"""``redact_pii_messages``: the PII redaction of ``redact_pii`` applied inside messages and trajectory steps.

The same patterns and placeholders (``operators.quality.pii``: e-mails, IP addresses, phone numbers) run over
the flat text fields (message ``content``; step ``observation``, ``action``, ``tool_result``) of a whole batch at
once; the structure is rebuilt around the redacted values and ``text`` is rendered again for the rows that
changed (so the engine records a ``modified`` lineage event). Counts per sample go to ``quality.pii_*``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds import kinds_of
from datahub.kinds.posttraining import render_messages, render_preference, render_steps
from datahub.operator import BatchOperator, add_quality_signals, register
from operators.posttraining.messages import flatten
from operators.quality.pii import PiiParams, RedactPii

# list column -> its text fields
TEXT_FIELDS = {"messages": ("content",), "prompt": ("content",), "chosen": ("content",), "rejected": ("content",),
               "steps": ("observation", "action", "tool_result")}


@register
class RedactPiiMessages(BatchOperator[PiiParams]):
    """Replace e-mails, IP addresses and phone numbers inside messages and steps; count them per sample."""

    name = "redact_pii_messages"
    version = "1"
    Params = PiiParams
    params: PiiParams
    annotates = True
    kinds: ClassVar[frozenset[str]] = frozenset({"chat", "preference", "trajectory"})

    def process(self, table: pa.Table) -> pa.Table:
        redactor = RedactPii(self.params)
        totals: dict[str, np.ndarray] = {}
        for column, fields in TEXT_FIELDS.items():
            if column not in table.column_names:
                continue
            flat = flatten(table.column(column))
            for field in fields:
                values = flat.field(field)
                redacted = redactor.process(pa.table({"text": values}))
                quality = redacted.column("quality").combine_chunks()
                for i, signal in enumerate(quality.type):
                    counts = np.asarray(pc.fill_null(quality.field(i), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
                    per_row = np.bincount(flat.parent, weights=counts, minlength=flat.rows).astype(np.int64)
                    totals[signal.name] = totals.get(signal.name, 0) + per_row
                new_values = pc.if_else(pc.is_null(values), values, redacted.column("text").combine_chunks())
                flat = flatten(flat.with_field(field, new_values))
            table = table.set_column(table.column_names.index(column), column, flat.with_field(fields[0], flat.field(fields[0])))
        if not totals:
            return table
        changed = np.asarray(sum(totals.values()), dtype=np.int64) > 0
        table = add_quality_signals(table, {name: pa.array(v) for name, v in totals.items()})
        if changed.any():
            table = table.set_column(table.column_names.index("text"), "text", _rendered(table, changed))
        return table


def _rendered(table: pa.Table, changed: np.ndarray) -> pa.Array:
    """``text`` with the changed rows rendered again from their (redacted) structure."""
    texts: list[Any] = table.column("text").to_pylist()
    rows = np.flatnonzero(changed)
    subset = table.take(pa.array(rows))
    kinds = kinds_of(subset).to_pylist()
    columns = {name: subset.column(name).to_pylist() for name in ("messages", "prompt", "chosen", "rejected", "steps",
                                                                   "step_offset") if name in subset.column_names}
    for j, (row, kind) in enumerate(zip(rows, kinds)):
        if kind == "chat":
            texts[row] = render_messages(columns["messages"][j])
        elif kind == "preference":
            texts[row] = render_preference(columns["prompt"][j] or [], columns["chosen"][j], columns["rejected"][j])
        elif kind == "trajectory":
            texts[row] = render_steps(columns["steps"][j], step_offset=columns["step_offset"][j] or 0)
    return pa.array(texts, pa.string())

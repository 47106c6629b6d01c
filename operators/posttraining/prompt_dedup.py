"""``prompt_dedup``: exact dedup on the prompt only, so one prompt with many answers keeps one sample.

The key is the sample's kind (``<|chat|>`` / ``<|preference|>``, so a chat and a preference pair on the same prompt
are never each other's duplicates) then the prompt's rendering (``datahub.kinds.posttraining``): for a ``chat``,
its messages before the first assistant message; for a ``preference``, its ``prompt``; one ``<|ROLE|>`` block per
message. It runs the
``exact_dedup`` machinery unchanged (normalization, keep rule, incremental lake index, lineage), with the prompt
standing in for ``text`` while it runs; dropped rows get reason ``duplicate_prompt`` and the usual ``dup_of`` ref.
A dedup signature is a key function, not a new pipeline (DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds import kinds_of
from datahub.operator import DROP_OP, DROP_REASON, OperatorContext, register
from operators.dedup.exact_op import ExactDedup
from operators.dedup.params import ExactDedupParams
from operators.posttraining.messages import as_bool, flatten, strings

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

FULL_TEXT = "_prompt_dedup_text"
REASON = "duplicate_prompt"


def prompt_blocks(column: pa.Array | pa.ChunkedArray, *, until_assistant: bool) -> pa.Array:
    """Per row, the ``<|ROLE|>`` blocks of its messages joined by newlines (up to the first assistant one)."""
    flat = flatten(column)
    roles = strings(flat.field("role"))
    blocks = pc.binary_join_element_wise("<|", roles, "|>\n", strings(flat.field("content")), "")
    keep = np.ones(len(flat.parent), dtype=bool)
    if until_assistant:
        assistant = as_bool(pc.equal(roles, "assistant")).astype(np.int64)
        seen = np.cumsum(assistant)  # assistants up to and including each message, over the whole batch
        before_row = np.concatenate([[0], np.cumsum(assistant)])[flat.offsets[:-1]]
        keep = (seen - before_row[flat.parent]) == 0
    kept_parent = flat.parent[keep]
    counts = np.bincount(kept_parent, minlength=flat.rows)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lists = pa.ListArray.from_arrays(pa.array(offsets), blocks.filter(pa.array(keep)))
    return pc.binary_join(lists, "\n")


@dataclass(frozen=True)
class PromptAsText:
    """Batch function: keep the full ``text`` aside and put the prompt's rendering in its place."""

    def __call__(self, table: pa.Table) -> pa.Table:
        if not table.num_rows or "text" not in table.column_names:
            return table
        kinds = kinds_of(table)
        prompt = pa.nulls(table.num_rows, pa.string())
        if "messages" in table.column_names:
            prompt = pc.if_else(pc.equal(kinds, "chat"), prompt_blocks(table.column("messages"), until_assistant=True), prompt)
        if "prompt" in table.column_names:
            prompt = pc.if_else(pc.equal(kinds, "preference"), prompt_blocks(table.column("prompt"), until_assistant=False), prompt)
        # the kind leads the key: an SFT chat and a DPO pair on one prompt are different data (their sample_ids
        # differ too); rows of other kinds keep a null key (binary_join_element_wise emits null for null)
        prompt = pc.binary_join_element_wise("<|", kinds, "|>\n", prompt, "")
        text = table.column("text")
        table = table.append_column(FULL_TEXT, text)
        return table.set_column(table.column_names.index("text"), "text", prompt)


@dataclass(frozen=True)
class RestoreText:
    """Batch function: the full ``text`` back; this operator's drops renamed ``duplicate_prompt``."""

    op_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        if FULL_TEXT not in table.column_names:
            return table
        table = table.set_column(table.column_names.index("text"), "text", table.column(FULL_TEXT)).drop_columns([FULL_TEXT])
        if DROP_REASON in table.column_names and DROP_OP in table.column_names:
            mine = pc.fill_null(pc.equal(table.column(DROP_OP), self.op_id), False)
            reason = pc.if_else(mine, pa.scalar(REASON), table.column(DROP_REASON))
            table = table.set_column(table.column_names.index(DROP_REASON), DROP_REASON, reason)
        return table


@register
class PromptDedup(ExactDedup):
    """Exact duplicates of the prompt (chat: messages before the first assistant turn; preference: ``prompt``)."""

    name = "prompt_dedup"
    version = "2"  # 2: the kind leads the key (its index rows are a new namespace: v1's are not matched)
    Params = ExactDedupParams
    kinds: ClassVar[frozenset[str]] = frozenset({"chat", "preference"})

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        swapped = frame.map_batches(PromptAsText(), name="prompt_dedup.prompt")
        return super().apply(swapped, context).map_batches(RestoreText(self.op_id), name="prompt_dedup.restore")

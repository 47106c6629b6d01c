"""``decontaminate``: drop samples that share long word n-grams with a registered evaluation set.

The eval n-grams (``operators.decontam.ngrams``) are loaded once on the driver from the lake's ``evalsets``
table (latest version of each set) and shipped with the batch function to the workers; each batch of samples is
hashed in one vectorized pass and looked up with ``searchsorted``. A sample with at least ``min_overlap``
matching n-grams is dropped with reason ``contaminated`` and lineage ref ``evalset@version:item`` (the item of
its first match). Only live rows are looked at; dropped and quarantined rows pass through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.errors import OperatorError
from datahub.kinds.names import KINDS
from datahub.operator import DROP_OP, GlobalOperator, Operator, OperatorContext, Params, register
from operators.decontam.evalsets import load_index
from operators.decontam.ngrams import DEFAULT_NGRAM, NgramIndex
from operators.decontam.views import match_rows
from operators.dedup.steps import alive_mask

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

CONTAMINATED = "contaminated"


class DecontaminateParams(Params):
    ngram: int = Field(DEFAULT_NGRAM, ge=3, le=64, description="words per n-gram (13: GPT-3, Dolma)")
    min_overlap: int = Field(1, ge=1, description="matching n-grams a sample needs to count as contaminated")
    evalsets: list[str] | None = Field(None, description="eval set names to check against (default: all registered)")
    require_evalsets: bool = Field(True, description="fail when the lake has no registered eval set")


@dataclass(frozen=True)
class MarkContaminated:
    """Batch function: mark live rows whose text shares >= ``min_overlap`` n-grams with the index."""

    index: NgramIndex
    min_overlap: int
    op_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        if not table.num_rows or "text" not in table.column_names:
            return table
        live = alive_mask(table)
        live = live.combine_chunks() if isinstance(live, pa.ChunkedArray) else live
        alive = np.asarray(live.to_numpy(zero_copy_only=False), dtype=bool)
        matches = match_rows(self.index, table)
        contaminated = alive & (matches.counts >= self.min_overlap)
        if not contaminated.any():
            return table
        refs = pc.take(pa.array(self.index.refs, pa.string()), pa.array(matches.first_item, mask=~contaminated))
        mask = pa.array(contaminated)
        marked = Operator.mark_dropped(table, mask, CONTAMINATED, ref=refs)
        current = marked.column(DROP_OP) if DROP_OP in marked.column_names else pa.nulls(marked.num_rows, pa.string())
        drop_op = pc.if_else(mask, pa.scalar(self.op_id), current)
        if DROP_OP in marked.column_names:
            return marked.set_column(marked.column_names.index(DROP_OP), DROP_OP, drop_op)
        return marked.append_column(DROP_OP, drop_op)


@register
class Decontaminate(GlobalOperator[DecontaminateParams]):
    """Drop samples sharing n-grams with registered eval sets (reason ``contaminated``, ref ``evalset@version:item``)."""

    name = "decontaminate"
    version = "2"  # 2: chats, preference pairs and trajectories matched by their conversation views too
    Params = DecontaminateParams
    params: DecontaminateParams
    # every kind fills ``text`` (a caption, a rendered chat); post-training kinds are matched by views of their
    # conversation columns too (``views``), so a question and answer inside a chat are caught
    kinds: ClassVar[frozenset[str]] = frozenset(KINDS)

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        p = self.params
        index = load_index(context.lake, p.evalsets, ngram=p.ngram)
        if not len(index):
            if p.require_evalsets:
                raise OperatorError(
                    f"operator {self.op_id}: no eval set is registered in lake {context.lake.root}, so nothing can be "
                    f"checked; register one (datahub evalset add NAME PATH --lake {context.lake.ref}) or set "
                    "require_evalsets: false")
            return frame
        return frame.map_batches(MarkContaminated(index, p.min_overlap, self.op_id), name="decontaminate.mark")

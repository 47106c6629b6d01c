"""Document length bounds in characters and words (a cheap first filter)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import register
from operators.quality import textstats as ts
from operators.quality.base import FilterParams, QualityFilter


class LengthParams(FilterParams):
    min_chars: int | None = Field(None, ge=0)
    max_chars: int | None = Field(None, ge=1)
    min_words: int | None = Field(None, ge=0)
    max_words: int | None = Field(None, ge=1)


@register
class LengthFilter(QualityFilter[LengthParams]):
    """Record ``length_chars``/``length_words``; drop documents outside the configured bounds."""

    name = "length_filter"
    version = "1"
    Params = LengthParams

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        text = pc.fill_null(table.column("text"), "")
        return {
            "length_chars": ts.to_numpy(pc.utf8_length(text), np.int64),
            "length_words": ts.to_numpy(pc.list_value_length(pc.utf8_split_whitespace(text)), np.int64),
        }

    def rules(self, s: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        p: LengthParams = self.params
        bounds = [("too_few_chars", p.min_chars, s["length_chars"] < (p.min_chars or 0)),
                  ("too_many_chars", p.max_chars, s["length_chars"] > (p.max_chars or np.inf)),
                  ("too_few_words", p.min_words, s["length_words"] < (p.min_words or 0)),
                  ("too_many_words", p.max_words, s["length_words"] > (p.max_words or np.inf))]
        return [(name, failing) for name, limit, failing in bounds if limit is not None]

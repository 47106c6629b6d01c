"""Language identification with langid.py (Lui & Baldwin 2012), whose model ships inside the
PyPI package: nothing is downloaded at run time. Scores are normalized probabilities.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from datahub.operator import register
from operators.quality.base import FilterParams, QualityFilter


class LanguageParams(FilterParams):
    allowed: list[str] | None = Field(default_factory=lambda: ["en"], description="ISO 639-1 codes; None keeps all")
    # FineWeb keeps English at fastText score >= 0.65 (Penedo et al. 2024, 3.1); langid's
    # normalized scores run lower on short texts, so 0.5 is the default here.
    min_score: float = Field(0.5, ge=0, le=1)
    candidates: list[str] | None = Field(None, description="restrict the classifier to these languages")
    max_chars: int = Field(4000, ge=100, description="classify on the first N characters (speed)")


@functools.lru_cache(maxsize=4)
def _identifier(candidates: tuple[str, ...] | None) -> Any:
    from langid.langid import LanguageIdentifier, model

    identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
    if candidates:
        identifier.set_languages(list(candidates))
    return identifier


@register
class LanguageId(QualityFilter):
    """Annotate ``language`` and ``language_score``; drop languages outside ``allowed`` or low scores."""

    name = "language_id"
    version = "1"
    Params = LanguageParams
    requires = (("langid", "langid>=1.1.6"),)

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        p: LanguageParams = self.params  # type: ignore[assignment]
        identifier = _identifier(tuple(p.candidates) if p.candidates else None)
        heads = pc.utf8_slice_codeunits(pc.fill_null(table.column("text"), ""), 0, p.max_chars).to_pylist()
        # langid classifies one document at a time (its feature extraction is per string).
        results = [identifier.classify(t) if t.strip() else ("und", 0.0) for t in heads]
        return {
            "language": pa.array([lang for lang, _ in results], pa.string()),
            "language_score": np.array([score for _, score in results], dtype=np.float64),
        }

    def process(self, table: pa.Table) -> pa.Table:
        p: LanguageParams = self.params  # type: ignore[assignment]
        signals = self.signals(table)
        from datahub.operator import add_quality_signals

        table = add_quality_signals(table, {"language": signals["language"], "language_score": pa.array(signals["language_score"])})
        if not p.drop:
            return table
        language = signals["language"]
        not_allowed = pc.invert(pc.is_in(language, value_set=pa.array(p.allowed, pa.string()))) if p.allowed else pa.array([False] * table.num_rows)
        low = pa.array(signals["language_score"] < p.min_score)
        reason = pc.if_else(not_allowed, pa.scalar("language_not_allowed"),
                            pc.if_else(low, pa.scalar("language_low_score"), pa.scalar(None, pa.string())))
        return self.mark_dropped(table, pc.is_valid(reason), reason)

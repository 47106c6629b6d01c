"""Language identification with langid.py (Lui & Baldwin 2012), whose model ships inside the
PyPI package: nothing is downloaded at run time. Scores are normalized probabilities.

Speed: one ``LanguageIdentifier`` per process and candidate set; langid's byte-DFA feature
extraction runs per document, but the naive-Bayes scoring runs as one float64 matrix product
per block of documents instead of langid's per-document ``np.dot`` (which re-casts the float32
model to float64 on every call and, on a busy machine, stalls in OpenBLAS's threaded gemv:
62-166 docs/s before, see benchmarks/quality.py). Labels and scores equal ``classify()``.
Only the first ``max_chars`` characters are classified (fastText/CCNet-style pipelines
classify a prefix too).
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


_BLOCK = 256  # documents per matrix product: (256, 7480) float64 features, about 15 MB
# Below this top-2 gap in log-probability, fall back to langid's full normalization so a
# near-tie resolves exactly as classify() resolves it (argmax over the normalized vector).
_TIE_GAP = 1e-6


@functools.lru_cache(maxsize=4)
def _identifier(candidates: tuple[str, ...] | None) -> Any:
    """One langid identifier (normalized probabilities) per process and candidate set."""
    from langid.langid import LanguageIdentifier, model

    identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
    if candidates:
        identifier.set_languages(list(candidates))
    return identifier


@functools.lru_cache(maxsize=4)
def _model64(candidates: tuple[str, ...] | None) -> Any:
    """The identifier's class-conditional log-probabilities as float64, cast once (langid casts per call)."""
    identifier = _identifier(candidates)
    return np.ascontiguousarray(identifier.nb_ptc, dtype=np.float64), identifier.nb_pc, list(identifier.nb_classes)


def classify_texts(texts: list[str], *, candidates: tuple[str, ...] | None = None) -> list[tuple[str, float]]:
    """(language, normalized probability) per text, as langid's ``classify``; blank texts -> ("und", 0.0)."""
    identifier = _identifier(candidates)
    ptc, pc_prior, classes = _model64(candidates)
    results: list[tuple[str, float]] = [("und", 0.0)] * len(texts)
    live = [i for i, t in enumerate(texts) if t.strip()]
    for start in range(0, len(live), _BLOCK):
        rows = live[start:start + _BLOCK]
        features = np.stack([identifier.instance2fv(texts[i]) for i in rows]).astype(np.float64)
        log_prob = features @ ptc + pc_prior  # langid nb_classprobs, one gemm for the block
        best = np.argmax(log_prob, axis=1)
        with np.errstate(over="ignore"):  # langid's norm_probs, only for the winning class's row
            conf = 1 / np.exp(log_prob - log_prob[np.arange(len(rows)), best][:, None]).sum(axis=1)
        top2 = np.partition(log_prob, -2, axis=1)[:, -2:] if log_prob.shape[1] > 1 else None
        near_tie = (top2[:, 1] - top2[:, 0] < _TIE_GAP) if top2 is not None else np.zeros(len(rows), bool)
        for row, i in enumerate(rows):
            if near_tie[row]:
                with np.errstate(over="ignore"):
                    probs = identifier.norm_probs(log_prob[row])
                cl = int(np.argmax(probs))
                results[i] = (str(classes[cl]), float(probs[cl]))
            else:
                results[i] = (str(classes[best[row]]), float(conf[row]))
    return results


@register
class LanguageId(QualityFilter[LanguageParams]):
    """Annotate ``language`` and ``language_score``; drop languages outside ``allowed`` or low scores."""

    name = "language_id"
    version = "1"
    Params = LanguageParams
    requires = (("langid", "langid>=1.1.6"),)

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:
        p: LanguageParams = self.params
        heads = pc.utf8_slice_codeunits(pc.fill_null(table.column("text"), ""), 0, p.max_chars).to_pylist()
        results = classify_texts(heads, candidates=tuple(p.candidates) if p.candidates else None)
        return {
            "language": pa.array([lang for lang, _ in results], pa.string()),
            "language_score": np.array([score for _, score in results], dtype=np.float64),
        }

    def process(self, table: pa.Table) -> pa.Table:
        p: LanguageParams = self.params
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

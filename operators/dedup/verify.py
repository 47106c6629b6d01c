"""The optional false-positive check: confirm LSH candidates by exact shingle-set Jaccard.

Unverified LSH candidates chain: A~B and B~C by chance put A and C in one cluster, and on
templated text (man pages) whole families collapse into giant clusters (precision 0.09 on
``benchmarks/dedup_e2e.py``). With ``verify: true`` each band bucket is turned into a star
around its smallest member (the *anchor*), every (member, anchor) pair is checked with the
exact Jaccard of the two normalized shingle-hash sets, and components are computed over
the confirmed edges only. Star pairs, not all pairs: a bucket of k documents costs k-1
checks (as in datatrove's per-bucket comparison to the first signature); a member only
similar to a non-anchor member can still join through another band.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.dedup.normalize import Normalization, normalize_texts
from operators.dedup.shingles import ShingleHasher

ANCHOR = "_dedup_anchor"
ANCHOR_TEXT = "_dedup_anchor_text"
JACCARD = "jaccard"


def _unique_per_document(hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(doc, hash)`` with duplicates removed: sort by (doc, hash), keep first of each run."""
    docs = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    order = np.lexsort((hashes, docs))
    docs, hashes = docs[order], hashes[order]
    first = np.ones(len(docs), dtype=bool)
    first[1:] = (docs[1:] != docs[:-1]) | (hashes[1:] != hashes[:-1])
    return docs[first], hashes[first]


def jaccard_pairs(left: np.ndarray, left_offsets: np.ndarray, right: np.ndarray, right_offsets: np.ndarray) -> np.ndarray:
    """Exact Jaccard of shingle-hash sets, pair ``i`` = (left doc i, right doc i); vectorized.

    Both sets are deduplicated, concatenated and sorted by (pair, hash); a hash in both sets
    appears twice in a row, so the intersection is a count of equal neighbours.
    """
    n = len(left_offsets) - 1
    left_docs, left_hashes = _unique_per_document(left, left_offsets)
    right_docs, right_hashes = _unique_per_document(right, right_offsets)
    left_sizes = np.bincount(left_docs, minlength=n)
    right_sizes = np.bincount(right_docs, minlength=n)
    docs = np.concatenate([left_docs, right_docs])
    hashes = np.concatenate([left_hashes, right_hashes])
    order = np.lexsort((hashes, docs))
    docs, hashes = docs[order], hashes[order]
    both = (docs[1:] == docs[:-1]) & (hashes[1:] == hashes[:-1])
    intersection = np.bincount(docs[1:][both], minlength=n)
    union = left_sizes + right_sizes - intersection
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, intersection / np.maximum(union, 1), 1.0)


@dataclass(frozen=True)
class JaccardCheck:
    """Batch of (sample_id, text, anchor, anchor_text) -> confirmed (sample_id, anchor, jaccard)."""

    shingler: ShingleHasher
    normalization: Normalization
    threshold: float

    def __call__(self, table: pa.Table) -> pa.Table:
        out_schema = pa.schema([("sample_id", pa.string()), (ANCHOR, pa.string()), (JACCARD, pa.float64())])
        if not table.num_rows:
            return out_schema.empty_table()
        left, left_offsets = self.shingler(normalize_texts(table.column("text"), self.normalization))
        right, right_offsets = self.shingler(normalize_texts(table.column(ANCHOR_TEXT), self.normalization))
        similarity = jaccard_pairs(left, left_offsets, right, right_offsets)
        confirmed = pa.array(similarity >= self.threshold)
        result = pa.table({
            "sample_id": pc.cast(table.column("sample_id"), pa.string()),
            ANCHOR: pc.cast(table.column(ANCHOR), pa.string()),
            JACCARD: pa.array(similarity, pa.float64()),
        })
        return result.filter(confirmed)

"""Cross-release dedup for ``release.merge``, reusing the dedup operators' kernels.

Rows arrive in ``--from`` order with a ``release_source`` column. Keep rule in every mode:
the first copy in ``--from`` order (then row order) wins. A sample held by several inputs
(the same ``sample_id``) is kept once and is not a drop.

- ``exact``: xxh3-128 of the normalized text (``operators.dedup.exact``), as ``exact_dedup``.
- ``near``: MinHash signatures and LSH bands (``operators.dedup.minhash``/``lsh``), connected
  components and the keep rule of ``operators.dedup.clustering`` run on the in-process
  ``ArrowFrame``. Each duplicate's exact shingle Jaccard to its keeper is measured
  (``operators.dedup.verify.JaccardCheck``); with ``verify`` (default) a candidate below the
  threshold is kept, so chained LSH candidates never drop a document unlike its keeper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError

DedupMode = Literal["exact", "near", "none"]
SOURCE_COLUMN = "release_source"
_ROW = "_merge_row"


@dataclass(frozen=True)
class Duplicates:
    """Rows dropped by a merge dedup: one per dropped sample."""

    sample_id: pa.Array
    dup_of: pa.Array
    dup_release: pa.Array
    source: pa.Array  # the input release of the dropped row
    extra: list[dict[str, Any]]  # per-row ref fields of the method (cluster_id, jaccard)
    method: str
    reason: str


def _first_per(rows: pa.Table, key: pa.Array | pa.ChunkedArray) -> pa.Table:
    """The first row (smallest ``_ROW``) of each ``key``, in row order."""
    first = pa.table({"key": key, _ROW: rows.column(_ROW)}).group_by("key", use_threads=False).aggregate([(_ROW, "min")])
    keep = pc.is_in(rows.column(_ROW), value_set=first.column(f"{_ROW}_min"))
    return rows.filter(keep)


def _lookup(rows: pa.Table, ids: pa.Array, column: str) -> pa.Array:
    index = pc.index_in(ids, value_set=rows.column("sample_id").combine_chunks())
    return rows.column(column).combine_chunks().take(index)


def dedup_rows(rows: pa.Table, mode: DedupMode, *, threshold: float = 0.8, verify: bool = True) -> tuple[pa.Table, Duplicates | None]:
    """``rows`` without cross-release duplicates (row order kept) and what was dropped."""
    if mode == "none":
        return rows, None
    if mode not in ("exact", "near"):
        raise ReleaseError(f"--dedup {mode!r}: expected exact, near or none")
    rows = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    distinct = _first_per(rows, rows.column("sample_id"))  # the same sample twice: kept once, not a drop
    if mode == "exact":
        kept, dups = _exact(distinct)
    else:
        kept, dups = _near(distinct, threshold=threshold, verify=verify)
    return kept.sort_by(_ROW).drop_columns([_ROW]), dups


def exact_keys(sample_ids: pa.Array | pa.ChunkedArray, texts: pa.Array | pa.ChunkedArray | None) -> tuple[pa.Array, str]:
    """The exact-dedup key of each row and the method's name (one batch at a time is fine: keys are per row)."""
    try:
        from operators.dedup.exact import content_hash_hex
    except ImportError:  # the dedup library is optional here; sample_id is a content hash too
        texts = None
    if texts is None:
        ids = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
        return ids, "sample_id"
    return content_hash_hex(texts), "exact_content_hash"


def dedup_keyed(rows: pa.Table, keys: pa.Array, method: str) -> tuple[pa.Table, Duplicates]:
    """Exact dedup of narrow rows (``sample_id``, ``release_source``, row order) by precomputed ``keys``: the
    streaming merge reads the text once, batch by batch, to make the keys, and never holds it."""
    rows = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64))).append_column("_key", keys)
    distinct = _first_per(rows, rows.column("sample_id"))
    kept, dups = _exact(distinct.drop_columns(["_key"]), keys=distinct.column("_key").combine_chunks(), method=method)
    return kept.sort_by(_ROW).drop_columns([_ROW]), dups


def _exact(rows: pa.Table, *, keys: pa.Array | None = None, method: str | None = None) -> tuple[pa.Table, Duplicates]:
    if keys is None:
        keys, method = exact_keys(rows.column("sample_id"), rows.column("text") if "text" in rows.column_names else None)
    assert method is not None
    kept = _first_per(rows, keys)
    is_kept = pc.is_in(rows.column(_ROW), value_set=kept.column(_ROW))
    dropped_keys = pc.filter(keys, pc.invert(is_kept))
    dropped = rows.filter(pc.invert(is_kept))
    kept_keys = pc.filter(keys, is_kept)
    winner = pc.index_in(dropped_keys, value_set=kept_keys)
    dup_of = kept.column("sample_id").combine_chunks().take(winner)
    return kept, Duplicates(
        sample_id=dropped.column("sample_id").combine_chunks(), dup_of=dup_of,
        dup_release=kept.column(SOURCE_COLUMN).combine_chunks().take(winner),
        source=dropped.column(SOURCE_COLUMN).combine_chunks(), extra=[{}] * dropped.num_rows,
        method=method, reason="merge_duplicate")


def _near(rows: pa.Table, *, threshold: float, verify: bool) -> tuple[pa.Table, Duplicates]:
    try:
        from datahub.engines.arrow import ArrowFrame
        from operators.dedup.clustering import CLUSTER_ID, KEEPER, QUALITY_SCORE, near_duplicate_clusters
        from operators.dedup.minhash_op import MinhashDedup
        from operators.dedup.params import MinhashDedupParams
        from operators.dedup.verify import ANCHOR, ANCHOR_TEXT, JACCARD, JaccardCheck
    except ImportError as exc:
        raise ReleaseError(f"--dedup near needs the dedup operators (operators.dedup): {exc}; install datahub "
                           "with its operators, or merge with --dedup exact") from None
    try:
        params = MinhashDedupParams(threshold=threshold)
    except ValueError as exc:
        raise ReleaseError(f"--threshold {threshold}: {exc}") from None
    operator = MinhashDedup(params)  # the operator's hasher and banding, so merge and pipeline dedup alike
    normalization = params.normalization.build()
    minhasher, bands, band_rows = operator.minhasher, operator.bands, operator.rows
    # The keep rule of clustering.choose_keepers takes the highest quality_score: the earliest row.
    documents = pa.table({"sample_id": rows.column("sample_id"), "text": rows.column("text"),
                          QUALITY_SCORE: pc.negate(pc.cast(rows.column(_ROW), pa.float64()))})
    clusters = near_duplicate_clusters(ArrowFrame(documents), minhasher=minhasher, bands=bands, rows=band_rows,
                                       use_quality_score=True, max_iterations=params.max_iterations)
    assert isinstance(clusters, ArrowFrame)
    candidates = clusters.table.filter(clusters.table.column("is_duplicate"))
    ids = candidates.column("sample_id").combine_chunks()
    keepers = candidates.column(KEEPER).combine_chunks()
    pairs = pa.table({"sample_id": ids, "text": _lookup(rows, ids, "text"),
                      ANCHOR: keepers, ANCHOR_TEXT: _lookup(rows, keepers, "text")})
    measured = JaccardCheck(minhasher.shingler, normalization, 0.0)(pairs)  # threshold 0: every pair, measured
    jaccard = measured.column(JACCARD).combine_chunks()
    drop = pc.greater_equal(jaccard, threshold) if verify else pa.array(np.ones(len(ids), dtype=bool))
    ids, keepers = ids.filter(drop), keepers.filter(drop)
    cluster_ids, jaccard = candidates.column(CLUSTER_ID).combine_chunks().filter(drop), jaccard.filter(drop)
    kept = rows.filter(pc.invert(pc.is_in(rows.column("sample_id"), value_set=ids)))
    extra = [{"cluster_id": c, "jaccard": round(j, 6)} for c, j in zip(cluster_ids.to_pylist(), jaccard.to_pylist())]
    return kept, Duplicates(
        sample_id=ids, dup_of=keepers, dup_release=_lookup(rows, keepers, SOURCE_COLUMN),
        source=_lookup(rows, ids, SOURCE_COLUMN), extra=extra, method="minhash", reason="merge_near_duplicate")

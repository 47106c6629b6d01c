"""Near-duplicate clusters as connected components, written once against ``Frame``.

Graph: documents are nodes; each LSH band key links every document that produced it.
Labels start as each document's own ``sample_id`` and iterate (min-label propagation,
with pointer jumping so chains converge in O(log n) rounds rather than O(length)):

1. band label  = min label over the band's members           (join + groupby min)
2. new label   = min band label over the document's bands    (join + groupby min)
3. new label   = min(new label, new label of that label)     (self join: pointer jumping)

until no label changes. The fixpoint labels every component with its smallest
``sample_id``. Keep rule per cluster: highest ``quality_score`` (null/NaN lowest) if the
documents have one, then smallest ``sample_id``; the others are dropped as ``dup_of`` it.
Everything here is pyarrow; the functions passed to the Frame are picklable classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import Operator
from operators.dedup.lsh import band_keys
from operators.dedup.minhash import MinHasher
from operators.dedup.steps import Select, SharedKeys, join_small

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

SAMPLE_ID = "sample_id"
BAND_KEY = "band_key"
BAND_KEYS = "band_keys"
CLUSTER_ID = "cluster_id"
KEEPER = "keeper"
QUALITY_SCORE = "quality_score"
EDGE_SCHEMA = pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEY, pa.int64())])


class ConvergenceError(RuntimeError):
    """Label propagation did not settle within ``max_iterations`` rounds."""


SIGNATURE_ROWS = 8192  # documents signed at once by BandKeys


@dataclass(frozen=True)
class BandKeys:
    """Batch function: documents -> ``(sample_id, band_keys)``, all bands' keys of a document in one
    fixed-size list (empty texts give no row). 8 bytes a band plus one id: a compact form to hold."""

    minhasher: MinHasher
    bands: int
    rows: int
    text_column: str = "text"
    id_column: str = SAMPLE_ID

    def schema(self) -> pa.Schema:
        return pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEYS, pa.list_(pa.int64(), self.bands))])

    def __call__(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return self.schema().empty_table()
        # a slice at a time: the normalized text and signatures (512 bytes a document) of a slice, not of a
        # whole block next to the block itself (62,500 short documents: 32 MB of signatures alone)
        return pa.concat_tables([self._keys(table.slice(start, SIGNATURE_ROWS))
                                 for start in range(0, table.num_rows, SIGNATURE_ROWS)])

    def _keys(self, table: pa.Table) -> pa.Table:
        signatures = self.minhasher.signatures(table.column(self.text_column))
        nonempty = np.flatnonzero((signatures != self.minhasher.empty_value).any(axis=1))
        keys = band_keys(signatures[nonempty], self.bands, self.rows)
        ids = table.column(self.id_column).take(pa.array(nonempty))
        flat = pa.array(np.ascontiguousarray(keys, dtype=np.int64).ravel())
        return pa.table({SAMPLE_ID: ids.cast(pa.string()), BAND_KEYS: pa.FixedSizeListArray.from_arrays(flat, self.bands)},
                        schema=self.schema())


@dataclass(frozen=True)
class ExplodeBandKeys:
    """Batch function: ``(sample_id, band_keys)`` -> one ``(sample_id, band_key)`` edge per band."""

    def __call__(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0 or BAND_KEYS not in table.column_names:
            return EDGE_SCHEMA.empty_table()
        lists = table.column(BAND_KEYS).combine_chunks()
        bands = lists.type.list_size
        ids = table.column(SAMPLE_ID).take(pa.array(np.repeat(np.arange(table.num_rows), bands)))
        return pa.table({SAMPLE_ID: ids.cast(pa.string()), BAND_KEY: lists.flatten()}, schema=EDGE_SCHEMA)


@dataclass(frozen=True)
class BandEdges(BandKeys):
    """Batch function: documents -> one ``(sample_id, band_key)`` row per band (empty texts give none)."""

    def __call__(self, table: pa.Table) -> pa.Table:
        return ExplodeBandKeys()(super().__call__(table))


class _SelfLabel:
    def __call__(self, table: pa.Table) -> pa.Table:
        ids = table.column(SAMPLE_ID)
        return pa.table({SAMPLE_ID: ids, "label": ids})


class _Jump:
    """label := min(label, label of label); a missing label-of-label keeps the label."""

    def __call__(self, table: pa.Table) -> pa.Table:
        label = table.column("label")
        jumped = pc.min_element_wise(label, table.column("label_of_label"), skip_nulls=True)
        return pa.table({SAMPLE_ID: table.column(SAMPLE_ID), "label": jumped})


class _Changed:
    def __call__(self, table: pa.Table) -> pa.Table:
        differ = pc.fill_null(pc.not_equal(table.column("label"), table.column("old_label")), True)
        return table.filter(differ).select([SAMPLE_ID])


def connected_components(edges: Frame, *, max_iterations: int = 64) -> Frame:
    """``(sample_id, cluster_id)`` for every document that shares a band key with another.

    ``edges`` is read twice (key counts, then the shared keys' edges): pass a materialized
    frame, or one that is cheaper to recompute than to hold (signatures of documents in memory).
    """
    # Most band keys belong to one document: count members on the keys alone (8 bytes a row
    # through the shuffle), then keep the edges of shared keys, a small share, by broadcast.
    shared = edges.map_batches(Select((BAND_KEY,)), name="dedup.band_keys").groupby_agg(
        [BAND_KEY], {"members": (BAND_KEY, "count")}, having=SharedKeys(BAND_KEY, "members")).materialize()
    edges = join_small(edges, shared, on=[BAND_KEY], how="inner", name="dedup.shared_edges").materialize()
    nodes = edges.groupby_agg([SAMPLE_ID], {"degree": (BAND_KEY, "count")})
    labels = nodes.map_batches(_SelfLabel(), name="dedup.initial_labels").materialize()
    for _ in range(max_iterations):
        band_label = edges.join(labels, on=[SAMPLE_ID]).groupby_agg([BAND_KEY], {"band_label": ("label", "min")})
        proposed = edges.join(band_label, on=[BAND_KEY]).groupby_agg([SAMPLE_ID], {"label": ("band_label", "min")})
        proposed = proposed.materialize()
        label_of_label = proposed.map_batches(
            Select((SAMPLE_ID, "label"), (("label", "label_of_label"), (SAMPLE_ID, "label"))), name="dedup.label_of_label"
        )
        # Join on the proposed label: rename the proposal's own id to avoid a name clash.
        jumped = proposed.join(label_of_label, on=["label"], how="left").map_batches(_Jump(), name="dedup.jump")
        jumped = jumped.materialize()
        old = labels.map_batches(Select((SAMPLE_ID, "label"), (("label", "old_label"),)), name="dedup.old_labels")
        changed = jumped.join(old, on=[SAMPLE_ID]).map_batches(_Changed(), name="dedup.changed").count()
        labels = jumped
        if changed == 0:
            return labels.map_batches(Select((SAMPLE_ID, "label"), (("label", CLUSTER_ID),)), name="dedup.components")
    raise ConvergenceError(
        f"connected components did not converge in {max_iterations} rounds; raise max_iterations "
        "(pointer jumping makes this rare: check for a degenerate band key shared by very many documents)"
    )


class _ScoreOrLowest:
    def __call__(self, table: pa.Table) -> pa.Table:
        score = pc.cast(table.column(QUALITY_SCORE), pa.float64())
        score = pc.fill_null(pc.if_else(pc.is_nan(score), -np.inf, score), -np.inf)
        return pa.table({SAMPLE_ID: table.column(SAMPLE_ID), CLUSTER_ID: table.column(CLUSTER_ID), QUALITY_SCORE: score})


class _BestOnly:
    def __call__(self, table: pa.Table) -> pa.Table:
        best = pc.equal(table.column(QUALITY_SCORE), table.column("best_score"))
        return table.filter(best).select([CLUSTER_ID, SAMPLE_ID])


class _MarkDuplicate:
    def __call__(self, table: pa.Table) -> pa.Table:
        duplicate = pc.not_equal(table.column(SAMPLE_ID), table.column(KEEPER))
        return table.select([SAMPLE_ID, CLUSTER_ID, KEEPER]).append_column("is_duplicate", duplicate)


def choose_keepers(components: Frame, scores: Frame | None = None) -> Frame:
    """``(sample_id, cluster_id, keeper, is_duplicate)`` per clustered document.

    ``scores`` is ``(sample_id, quality_score)``; without it the keeper is the cluster id
    (its smallest ``sample_id``), which costs no extra shuffle.
    """
    if scores is None:
        keepers = components.groupby_agg([CLUSTER_ID], {KEEPER: (SAMPLE_ID, "min")})
    else:
        scored = components.join(scores, on=[SAMPLE_ID], how="left").map_batches(_ScoreOrLowest(), name="dedup.scores")
        scored = scored.materialize()
        best = scored.groupby_agg([CLUSTER_ID], {"best_score": (QUALITY_SCORE, "max")})
        top = scored.join(best, on=[CLUSTER_ID]).map_batches(_BestOnly(), name="dedup.best")
        keepers = top.groupby_agg([CLUSTER_ID], {KEEPER: (SAMPLE_ID, "min")})
    return components.join(keepers, on=[CLUSTER_ID]).map_batches(_MarkDuplicate(), name="dedup.keep_rule")


@dataclass(frozen=True)
class MarkDuplicates:
    """Batch function over documents left-joined with ``choose_keepers``: mark non-keepers dropped."""

    reason: str = "near_duplicate"

    def __call__(self, table: pa.Table) -> pa.Table:
        keeper = table.column(KEEPER)
        mask = pc.fill_null(pc.not_equal(table.column(SAMPLE_ID), keeper), False)
        # sample ids are hex digests: no JSON escaping needed, so build the strings vectorized.
        refs = pc.binary_join_element_wise(
            '{"dup_of": "', keeper, '", "cluster_id": "', table.column(CLUSTER_ID), '"}', ""
        )
        marked = Operator.mark_dropped(table, mask, self.reason, ref=refs)
        drop = [c for c in (KEEPER, CLUSTER_ID, "is_duplicate") if c in marked.column_names]
        return marked.drop_columns(drop)


def near_duplicate_clusters(
    documents: Frame,
    *,
    minhasher: MinHasher,
    bands: int,
    rows: int,
    text_column: str = "text",
    use_quality_score: bool = False,
    max_iterations: int = 64,
) -> Frame:
    """Signatures -> band edges -> components -> keep rule, on any engine's Frame."""
    edges = documents.map_batches(BandEdges(minhasher, bands, rows, text_column), name="dedup.band_edges")
    components = connected_components(edges, max_iterations=max_iterations)
    scores = None
    if use_quality_score:
        scores = documents.map_batches(Select((SAMPLE_ID, QUALITY_SCORE)), name="dedup.quality_scores")
    return choose_keepers(components, scores)

"""``minhash_dedup``: near-duplicate removal with MinHash + LSH, clustered on the engine.

Pipeline (every step a Frame operation, so it runs distributed on Ray or Spark):

1. live rows -> MinHash signatures -> the LSH band keys of each document, held as one compact
   row per document; ``(sample_id, band_key)`` edges are exploded from it when read;
2. incremental: edges of samples kept by earlier runs (lake ``minhash_index``) that share a
   band key with a new document join the graph; their signatures are never recomputed;
3. optional ``verify``: candidate pairs confirmed by exact shingle Jaccard (``verify.py``);
4. connected components over the (confirmed) edges of shared band keys (``clustering.connected_components``);
5. keep rule (``ranking.py``), ranked only for the samples that may lose rows (clustered, or in
   several rows): lake samples first, then best ``quality.<keep_by>``, then smallest
   ``sample_id``; the rest are dropped as ``near_duplicate`` with ref
   ``{"dup_of", "cluster_id", "method": "minhash", "jaccard"?}``. The per-sample decisions
   reach the documents by a broadcast join (``steps.join_small``): the texts never go
   through a shuffle and exist once;
6. kept new samples' band keys are appended to ``minhash_index`` (a run side output, written
   by the workers when the decisions are known).
"""

from __future__ import annotations

from typing import ClassVar

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import GlobalOperator, OperatorContext, register
from operators.dedup.clustering import BAND_KEY, CLUSTER_ID, SAMPLE_ID, BandKeys, ExplodeBandKeys, connected_components
from operators.dedup.index import MINHASH_INDEX, lake_rows_of, read_index
from operators.dedup.minhash import MinHasher
from operators.dedup.params import MinhashDedupParams
from operators.dedup.ranking import is_lake_rank, lake_ranks, rank_sample_ids, row_ranks
from operators.dedup.steps import (KEEPER_RANK, ROW_RANK, KeepAlive, MarkAlive, MarkByKeeper, NotEqual, Select, SharedKeys,
                                  join_small, string_columns)
from operators.dedup.verify import ANCHOR, ANCHOR_SHINGLE_SET, JACCARD, SHINGLE_SET, SetJaccard, ShingleSets

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

CLUSTER = "_dedup_cluster"


@dataclass(frozen=True)
class AddRank:
    keep_by: str | None

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.append_column(ROW_RANK, row_ranks(table, self.keep_by))


@dataclass(frozen=True)
class IndexRows:
    params_hash: str
    run_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        n = table.num_rows
        return pa.table({
            SAMPLE_ID: pc.cast(table.column(SAMPLE_ID), pa.string()),
            BAND_KEY: pc.cast(table.column(BAND_KEY), pa.int64()),
            "params_hash": pa.array([self.params_hash] * n, pa.string()),
            "run_id": pa.array([self.run_id] * n, pa.string()),
        })


@register
class MinhashDedup(GlobalOperator[MinhashDedupParams]):
    """Near duplicates by MinHash-LSH (Broder 1997; Leskovec et al., MMDS ch. 3)."""

    name = "minhash_dedup"
    version = "1"
    Params = MinhashDedupParams
    # chat, preference and trajectory samples carry their canonical rendering in ``text`` (datahub.kinds.posttraining)
    kinds: ClassVar[frozenset[str]] = frozenset({"text", "chat", "preference", "trajectory"})

    def __init__(self, params: MinhashDedupParams | Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        p = self.params
        self.bands, self.rows = p.lsh_bands()  # for recall when verify is on (params.MinhashDedupParams.lsh_bands)
        self.minhasher = MinHasher(num_perm=p.num_perm, seed=p.seed, scheme=p.scheme, shingle=p.shingle, ngram=p.ngram,
                                   normalization=p.normalization.build())

    @property
    def index_params_hash(self) -> str:
        """What band keys depend on (not threshold/verify/keep_by): rows with another hash never match."""
        p = self.params
        payload = {"op": self.name, "v": self.version, "normalization": p.normalization.model_dump(), "shingle": p.shingle,
                   "ngram": p.ngram, "num_perm": p.num_perm, "seed": p.seed, "scheme": p.scheme,
                   "bands": self.bands, "rows": self.rows}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        p = self.params
        # The documents are held once (``reusable``), next to one compact row of band keys per
        # document (edges are exploded from it when read). Only the samples that may lose rows
        # (clustered or repeated) get ranks, and the decisions come back to the documents by a
        # broadcast join at the end.
        frame = frame.reusable()
        if frame.count() == 0:  # no record at all (empty inputs): nothing to compare, and no columns to key on
            return frame
        docs = frame.map_batches(KeepAlive(alive=True), name="minhash_dedup.alive")
        ids = docs.map_batches(Select((SAMPLE_ID,)), name="minhash_dedup.ids")
        if ids.count() == 0:
            return frame
        # Rows sharing a sample_id (same text, two files) are exact copies, clustered or not.
        repeated = ids.groupby_agg([SAMPLE_ID], {"rows": (SAMPLE_ID, "count")}, having=SharedKeys(SAMPLE_ID, "rows")).materialize()
        doc_keys = docs.map_batches(BandKeys(self.minhasher, self.bands, self.rows), name="minhash_dedup.band_keys")
        doc_keys = doc_keys.materialize()  # signatures once; edges are a cheap explode of this
        new_edges = doc_keys.map_batches(ExplodeBandKeys(), name="minhash_dedup.band_edges")
        context.checkpoint("minhash_dedup:after_signatures")
        edges, lake_ids, known = new_edges, None, None
        if p.incremental:
            edges, lake_ids, known = self._with_lake_edges(new_edges, context)
        jaccard = None
        if p.verify:
            edges, jaccard = self._verified_edges(edges, docs, lake_ids, context)
        components = connected_components(edges, max_iterations=p.max_iterations).map_batches(
            Select((SAMPLE_ID, CLUSTER_ID), ((CLUSTER_ID, CLUSTER),)), name="minhash_dedup.clusters").materialize()
        context.checkpoint("minhash_dedup:after_clustering")
        # Ranks of the samples that may lose rows only: clustered or repeated ones.
        needed = components.map_batches(Select((SAMPLE_ID,)), name="minhash_dedup.clustered_ids").union(repeated)
        needed = needed.groupby_agg([SAMPLE_ID], {"n": (SAMPLE_ID, "count")}, having=Select((SAMPLE_ID,)))
        ranks = join_small(docs.map_batches(AddRank(p.keep_by), name="minhash_dedup.rank").map_batches(
            Select((SAMPLE_ID, ROW_RANK)), name="minhash_dedup.ranks"), needed, on=[SAMPLE_ID], how="inner",
            name="minhash_dedup.needed_ranks")
        if lake_ids is not None:
            ranks = ranks.union(context.from_arrow(pa.table({SAMPLE_ID: lake_ids, ROW_RANK: lake_ranks(lake_ids)})))
        ranks = ranks.materialize()
        keepers = components.join(ranks, on=[SAMPLE_ID]).groupby_agg([CLUSTER], {KEEPER_RANK: (ROW_RANK, "min")})
        clustered = components.join(keepers, on=[CLUSTER])
        own_best = ranks.join(repeated, on=[SAMPLE_ID]).groupby_agg([SAMPLE_ID], {KEEPER_RANK: (ROW_RANK, "min")})
        own_best = own_best.map_batches(_OwnCluster(), name="minhash_dedup.own_cluster")
        # Per sample that may lose rows: its cluster (the smallest sample_id in it, so never above its
        # own id) and its keeper (the cluster's best rank, never worse than its own rows' best).
        decisions = clustered.union(own_best).groupby_agg([SAMPLE_ID], {CLUSTER: (CLUSTER, "min"),
                                                                         KEEPER_RANK: (KEEPER_RANK, "min")})
        if jaccard is not None:
            decisions = decisions.join(jaccard, on=[SAMPLE_ID], how="left")
        decisions = decisions.materialize()
        context.add_side_output(MINHASH_INDEX, self._index_rows(new_edges, decisions, repeated.count(), known, context))
        mark = MarkByKeeper(self.op_id, "near_duplicate", "minhash", CLUSTER, (ROW_RANK, KEEPER_RANK, CLUSTER, JACCARD))
        return join_small(frame, decisions, on=[SAMPLE_ID], name="minhash_dedup.decisions").map_batches(
            MarkAlive(p.keep_by, mark), name="minhash_dedup.mark").light()

    def _with_lake_edges(self, new_edges: Frame, context: OperatorContext) -> tuple[Frame, pa.Array | None, Frame | None]:
        """Add the lake's edges that share a band key with a new document (read on the engine, ``read_index``)."""
        new_keys = new_edges.groupby_agg([BAND_KEY], {"n": (SAMPLE_ID, "count")}).map_batches(
            Select((BAND_KEY,)), name="minhash_dedup.new_band_keys")
        index = read_index(context, MINHASH_INDEX, columns=[SAMPLE_ID, BAND_KEY], params_hash=self.index_params_hash,
                           among=(BAND_KEY, new_keys))
        if index is None:
            return new_edges, None, None
        match, known = index
        matched = match.to_arrow()  # only lake samples sharing a band with a new one: small
        if not matched.num_rows:
            return new_edges, None, known
        matched = matched.select([SAMPLE_ID, BAND_KEY]).cast(pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEY, pa.int64())]))
        lake_ids = pc.unique(matched.column(SAMPLE_ID).combine_chunks())
        return new_edges.union(context.from_arrow(matched)), lake_ids, known

    def _verified_edges(self, edges: Frame, docs: Frame, lake_ids: pa.Array | None,
                        context: OperatorContext) -> tuple[Frame, Frame]:
        """Edges of confirmed (member, anchor) pairs only, and the best Jaccard per sample."""
        p = self.params
        buckets = edges.groupby_agg([BAND_KEY], {"members": (SAMPLE_ID, "count"), ANCHOR: (SAMPLE_ID, "min")})
        buckets = buckets.map_batches(_SharedBuckets(), name="minhash_dedup.shared_buckets").materialize()
        starred = edges.join(buckets, on=[BAND_KEY]).map_batches(NotEqual(SAMPLE_ID, ANCHOR), name="minhash_dedup.members")
        starred = starred.materialize()
        pairs = starred.groupby_agg([SAMPLE_ID, ANCHOR], {"bands": (BAND_KEY, "count")}).map_batches(
            Select((SAMPLE_ID, ANCHOR)), name="minhash_dedup.pairs")
        texts = docs.map_batches(Select((SAMPLE_ID, "text")), name="minhash_dedup.texts")
        if lake_ids is not None and len(lake_ids):
            lake_texts = lake_rows_of(context.lake, "samples", [SAMPLE_ID, "text"], lake_ids)
            if lake_texts.num_rows:
                texts = texts.union(context.from_arrow(lake_texts))
        # Each document of a candidate pair shingled once (verify.ShingleSets), then pairs compare sets.
        pairs = pairs.materialize()
        in_pairs = pairs.map_batches(Select((SAMPLE_ID,)), name="minhash_dedup.pair_members").union(
            pairs.map_batches(Select((ANCHOR,), ((ANCHOR, SAMPLE_ID),)), name="minhash_dedup.pair_anchors"))
        in_pairs = in_pairs.groupby_agg([SAMPLE_ID], {"n": (SAMPLE_ID, "count")}, having=Select((SAMPLE_ID,)))
        sets = join_small(texts, in_pairs, on=[SAMPLE_ID], how="inner", name="minhash_dedup.pair_texts").map_batches(
            ShingleSets(self.minhasher.shingler, p.normalization.build()), name="minhash_dedup.shingle_sets").materialize()
        anchor_sets = sets.map_batches(Select((SAMPLE_ID, SHINGLE_SET), ((SAMPLE_ID, ANCHOR), (SHINGLE_SET, ANCHOR_SHINGLE_SET))),
                                       name="minhash_dedup.anchor_sets")
        checked = pairs.join(sets, on=[SAMPLE_ID]).join(anchor_sets, on=[ANCHOR]).map_batches(
            SetJaccard(p.threshold), name="minhash_dedup.jaccard")
        confirmed = checked.groupby_agg([SAMPLE_ID, ANCHOR], {JACCARD: (JACCARD, "max")}).materialize()
        member_edges = starred.join(confirmed.map_batches(Select((SAMPLE_ID, ANCHOR)), name="minhash_dedup.confirmed"),
                                    on=[SAMPLE_ID, ANCHOR]).map_batches(Select((SAMPLE_ID, BAND_KEY)), name="minhash_dedup.member_edges")
        anchor_edges = buckets.map_batches(Select((ANCHOR, BAND_KEY), ((ANCHOR, SAMPLE_ID),)), name="minhash_dedup.anchor_edges")
        best = confirmed.map_batches(Select((SAMPLE_ID, JACCARD)), name="minhash_dedup.jaccard_member").union(
            confirmed.map_batches(Select((ANCHOR, JACCARD), ((ANCHOR, SAMPLE_ID),)), name="minhash_dedup.jaccard_anchor"))
        best = best.groupby_agg([SAMPLE_ID], {JACCARD: (JACCARD, "max")})
        return member_edges.union(anchor_edges.map_batches(Select((SAMPLE_ID, BAND_KEY)), name="minhash_dedup.anchor_order")), best

    def _index_rows(self, new_edges: Frame, decisions: Frame, repeated: int, known: Frame | None,
                    context: OperatorContext) -> Frame:
        """``minhash_index`` rows: every band key of every kept new sample, each exactly once."""
        lost = decisions.map_batches(_LostSamples(), name="minhash_dedup.lost")  # samples none of whose rows is kept
        rows = join_small(new_edges, lost, on=[SAMPLE_ID], how="left_anti", name="minhash_dedup.kept_edges")
        if known is not None:  # --full: never repeat a sample the index lists
            seen = known.groupby_agg([SAMPLE_ID], {"n": (SAMPLE_ID, "count")}, having=Select((SAMPLE_ID,)))
            rows = join_small(rows, seen, on=[SAMPLE_ID], how="left_anti", name="minhash_dedup.not_indexed")
        if repeated:  # one sample_id in several rows emitted its edges several times
            rows = rows.groupby_agg([SAMPLE_ID, BAND_KEY], {"n": (SAMPLE_ID, "count")})
        return rows.map_batches(IndexRows(self.index_params_hash, context.run_id), name="minhash_dedup.index_rows")


class _LostSamples:
    """Decisions whose keeper is another sample (or the lake's copy): that sample is dropped whole."""

    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        lost = pc.fill_null(pc.not_equal(rank_sample_ids(table.column(KEEPER_RANK)), table.column(SAMPLE_ID)), False)
        lost = pc.or_(lost, pc.fill_null(is_lake_rank(table.column(KEEPER_RANK)), False))
        return table.filter(lost).select([SAMPLE_ID])


class _SharedBuckets:
    def __call__(self, table: pa.Table) -> pa.Table:
        shared = table.filter(pc.greater(table.column("members"), 1))
        return shared.select([BAND_KEY, ANCHOR])


class _OwnCluster:
    """A repeated sample as a decision: its own cluster, its best row as keeper."""

    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        return pa.table({SAMPLE_ID: table.column(SAMPLE_ID), CLUSTER: table.column(SAMPLE_ID),
                         KEEPER_RANK: table.column(KEEPER_RANK)})



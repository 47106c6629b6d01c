"""``image_dedup``: near-duplicate images by 64-bit perceptual hash, through the shared dedup machinery.

A new key function, not a new pipeline (DESIGN.md): the steps are ``minhash_dedup``'s.

1. live rows -> perceptual hash (``operators.media.hashing``; pHash by default) -> band keys: the 64 bits cut
   into ``bands`` slices, each slice (with its band number) one key. Two hashes within Hamming distance
   ``max_distance`` differ in at most ``max_distance`` bits, so with ``bands = max_distance + 1`` they agree on
   at least one whole slice (the pigeonhole principle: multi-index hashing, Norouzi et al., CVPR 2012): every
   pair within the distance is a candidate, none is missed by the LSH;
2. incremental: band keys of samples kept by earlier runs (lake ``image_index``) that meet a new key join in;
3. candidate pairs (rows sharing a band key) are verified by their exact Hamming distance;
4. the confirmed pairs are the edges of ``clustering.connected_components``;
5. keep rule (``operators.dedup.ranking``: lake samples first, then best ``quality.<keep_by>``, then smallest
   ``sample_id``); the others are dropped as ``near_duplicate`` with ref ``{"dup_of", "cluster_id",
   "method": "phash"|"dhash"}``; rows with the same ``sample_id`` (same image and caption) as
   ``exact_duplicate``;
6. kept new samples' band keys and hashes go to ``image_index``.

Cost: a band key's rows are compared pairwise, so very common keys (blank or single-colour images hash alike)
are the quadratic part; fewer, wider bands (``bands``) trade recall beyond the guarantee for fewer candidates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pydantic import Field

from datahub.kinds.media import IMAGE
from datahub.operator import GlobalOperator, OperatorContext, Params, register
from operators.dedup.clustering import BAND_KEY, CLUSTER_ID, SAMPLE_ID, connected_components
from operators.dedup.index import read_index
from operators.dedup.ranking import is_lake_rank, lake_ranks, rank_sample_ids, row_ranks
from operators.dedup.steps import (KEEPER_RANK, ROW_RANK, KeepAlive, MarkAlive, MarkByKeeper, Select, SharedKeys,
                                  join_small, string_columns)
from operators.media.hashing import HASH_BITS, HashKind, hamming, perceptual_hashes, to_signed

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

IMAGE_INDEX = "image_index"
IMAGE_INDEX_SCHEMA = pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEY, pa.int64()), ("image_hash", pa.int64()),
                                ("params_hash", pa.string()), ("run_id", pa.string())])
HASH = "_image_hash"
OTHER = "_other_id"
OTHER_HASH = "_other_hash"
CLUSTER = "_dedup_cluster"
HASH_ROWS = 1024  # images decoded per thread-pool round


class ImageDedupParams(Params):
    hash: HashKind = Field("phash", description="perceptual hash: phash (DCT, robust to re-encoding) or dhash")
    # imagehash's README and common practice treat pHash distances up to ~10 of 64 bits as the same picture;
    # benchmarks/image_dedup.py measures precision/recall of this default on real images and their variants.
    max_distance: int = Field(10, ge=0, le=32, description="Hamming distance (bits of 64) at or below which "
                              "two images are near duplicates")
    bands: int | None = Field(None, ge=1, le=HASH_BITS, description="LSH bands over the 64 bits; default "
                              "max_distance + 1, which finds every pair within max_distance")
    keep_by: str | None = Field(None, description="field of the `quality` struct; the highest value in a cluster "
                                "is kept (then the smallest sample_id)")
    incremental: bool = Field(True, description="also dedup against images kept by earlier runs (lake image_index)")
    threads: int | None = Field(None, ge=1, description="decode threads per task (default: CPUs, at most 8)")
    max_iterations: int = Field(64, ge=1, le=1000)

    def band_count(self) -> int:
        return self.bands if self.bands is not None else min(HASH_BITS, self.max_distance + 1)


def band_slices(bands: int) -> list[tuple[int, int]]:
    """``(start_bit, width)`` of each band: 64 bits split as evenly as possible."""
    edges = np.linspace(0, HASH_BITS, bands + 1).round().astype(int)
    return [(int(a), int(b - a)) for a, b in zip(edges[:-1], edges[1:])]


def band_keys_of(hashes: np.ndarray, bands: int) -> np.ndarray:
    """(n, bands) int64 keys: band number in the top byte, the band's bits below (distinct bands never meet)."""
    unsigned = hashes.astype(np.uint64)
    keys = np.empty((len(hashes), bands), dtype=np.uint64)
    for b, (start, width) in enumerate(band_slices(bands)):
        shift = np.uint64(HASH_BITS - start - width)
        mask = np.uint64((1 << width) - 1)
        keys[:, b] = (np.uint64(b) << np.uint64(56)) | ((unsigned >> shift) & mask)
    return keys.view(np.int64)


@dataclass(frozen=True)
class HashEdges:
    """Batch function: rows -> one ``(sample_id, band_key, hash)`` edge per band (undecodable images give none)."""

    kind: HashKind
    bands: int
    threads: int | None

    def schema(self) -> pa.Schema:
        return pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEY, pa.int64()), (HASH, pa.int64())])

    def __call__(self, table: pa.Table) -> pa.Table:
        parts = [self._edges(table.slice(start, HASH_ROWS)) for start in range(0, table.num_rows, HASH_ROWS)]
        return pa.concat_tables(parts) if parts else self.schema().empty_table()

    def _edges(self, table: pa.Table) -> pa.Table:
        hashes, ok = perceptual_hashes(table.column(IMAGE).to_pylist(), self.kind, threads=self.threads)
        rows = np.flatnonzero(ok)
        keys = band_keys_of(hashes[rows], self.bands)
        repeat = pa.array(np.repeat(rows, self.bands))
        return pa.table({SAMPLE_ID: pc.cast(table.column(SAMPLE_ID).take(repeat), pa.string()),
                         BAND_KEY: pa.array(keys.ravel(), pa.int64()),
                         HASH: pa.array(np.repeat(to_signed(hashes[rows]), self.bands), pa.int64())}, schema=self.schema())


@dataclass(frozen=True)
class VerifyPairs:
    """Batch function over rows sharing a band key: the pairs (smaller id first) within ``max_distance`` bits."""

    max_distance: int

    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        first = pc.less(table.column(SAMPLE_ID), table.column(OTHER))
        table = table.filter(pc.fill_null(first, False))
        distance = hamming(table.column(HASH).to_numpy(), table.column(OTHER_HASH).to_numpy())
        close = table.filter(pa.array(distance <= self.max_distance))
        return pa.table({SAMPLE_ID: close.column(SAMPLE_ID), OTHER: close.column(OTHER),
                         "distance": pa.array(distance[distance <= self.max_distance], pa.int64())})


@dataclass(frozen=True)
class PairEdges:
    """Batch function: each confirmed pair -> two ``(sample_id, band_key)`` edges on a key naming the pair."""

    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        ids, others = table.column(SAMPLE_ID).to_pylist(), table.column(OTHER).to_pylist()
        keys = pa.array([xxhash.xxh3_64_intdigest(f"{a}\x00{b}".encode()) for a, b in zip(ids, others)], pa.uint64())
        keys = pc.cast(keys, pa.int64(), safe=False)
        return pa.table({SAMPLE_ID: pa.concat_arrays([pa.array(ids, pa.string()), pa.array(others, pa.string())]),
                         BAND_KEY: pa.concat_arrays([keys, keys])})


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
        return pa.table({SAMPLE_ID: pc.cast(table.column(SAMPLE_ID), pa.string()),
                         BAND_KEY: pc.cast(table.column(BAND_KEY), pa.int64()),
                         "image_hash": pc.cast(table.column(HASH), pa.int64()),
                         "params_hash": pa.array([self.params_hash] * n, pa.string()),
                         "run_id": pa.array([self.run_id] * n, pa.string())}, schema=IMAGE_INDEX_SCHEMA)


@register
class ImageDedup(GlobalOperator[ImageDedupParams]):
    """Near-duplicate images: perceptual hash, Hamming-distance bands, verified pairs, connected components."""

    name = "image_dedup"
    version = "2"  # 2: pHash thumbnails from a 1/8-scale JPEG decode and a 2x box-reduce gap (operators.media.hashing)
    Params = ImageDedupParams
    kinds = frozenset({"image_text"})

    def __init__(self, params: ImageDedupParams | Mapping[str, Any] | None = None) -> None:
        super().__init__(params)
        self.bands = self.params.band_count()

    @property
    def index_params_hash(self) -> str:
        """What band keys depend on (the hash and the bands), not the distance or the keep rule."""
        payload = {"op": self.name, "v": self.version, "hash": self.params.hash, "bands": self.bands}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        p = self.params
        frame = frame.reusable()
        if frame.count() == 0:
            return frame
        docs = frame.map_batches(KeepAlive(alive=True), name="image_dedup.alive")
        ids = docs.map_batches(Select((SAMPLE_ID,)), name="image_dedup.ids")
        if ids.count() == 0:
            return frame
        repeated = ids.groupby_agg([SAMPLE_ID], {"rows": (SAMPLE_ID, "count")}, having=SharedKeys(SAMPLE_ID, "rows")).materialize()
        new_edges = docs.map_batches(HashEdges(p.hash, self.bands, p.threads), name="image_dedup.hash_edges").materialize()
        context.checkpoint("image_dedup:after_hashes")
        edges, lake_ids, known = new_edges, None, None
        if p.incremental:
            edges, lake_ids, known = self._with_lake_edges(new_edges, context)
        shared = edges.map_batches(Select((BAND_KEY,)), name="image_dedup.band_keys").groupby_agg(
            [BAND_KEY], {"members": (BAND_KEY, "count")}, having=SharedKeys(BAND_KEY, "members")).materialize()
        candidates = join_small(edges, shared, on=[BAND_KEY], how="inner", name="image_dedup.shared_edges").materialize()
        others = candidates.map_batches(Select((SAMPLE_ID, BAND_KEY, HASH), ((SAMPLE_ID, OTHER), (HASH, OTHER_HASH))),
                                        name="image_dedup.other_side")
        pairs = candidates.join(others, on=[BAND_KEY]).map_batches(VerifyPairs(p.max_distance), name="image_dedup.verify")
        pairs = pairs.groupby_agg([SAMPLE_ID, OTHER], {"distance": ("distance", "min")}).materialize()
        pair_edges = pairs.map_batches(PairEdges(), name="image_dedup.pair_edges").materialize()
        components = connected_components(pair_edges, max_iterations=p.max_iterations).map_batches(
            Select((SAMPLE_ID, CLUSTER_ID), ((CLUSTER_ID, CLUSTER),)), name="image_dedup.clusters").materialize()
        context.checkpoint("image_dedup:after_clustering")
        needed = components.map_batches(Select((SAMPLE_ID,)), name="image_dedup.clustered_ids").union(repeated)
        needed = needed.groupby_agg([SAMPLE_ID], {"n": (SAMPLE_ID, "count")}, having=Select((SAMPLE_ID,)))
        ranks = join_small(docs.map_batches(AddRank(p.keep_by), name="image_dedup.rank").map_batches(
            Select((SAMPLE_ID, ROW_RANK)), name="image_dedup.ranks"), needed, on=[SAMPLE_ID], how="inner",
            name="image_dedup.needed_ranks")
        if lake_ids is not None:
            ranks = ranks.union(context.from_arrow(pa.table({SAMPLE_ID: lake_ids, ROW_RANK: lake_ranks(lake_ids)})))
        ranks = ranks.materialize()
        keepers = components.join(ranks, on=[SAMPLE_ID]).groupby_agg([CLUSTER], {KEEPER_RANK: (ROW_RANK, "min")})
        clustered = components.join(keepers, on=[CLUSTER])
        own_best = ranks.join(repeated, on=[SAMPLE_ID]).groupby_agg([SAMPLE_ID], {KEEPER_RANK: (ROW_RANK, "min")})
        own_best = own_best.map_batches(_OwnCluster(), name="image_dedup.own_cluster")
        decisions = clustered.union(own_best).groupby_agg([SAMPLE_ID], {CLUSTER: (CLUSTER, "min"),
                                                                         KEEPER_RANK: (KEEPER_RANK, "min")}).materialize()
        context.add_side_output(IMAGE_INDEX, self._index_rows(new_edges, decisions, repeated.count(), known, context))
        mark = MarkByKeeper(self.op_id, "near_duplicate", p.hash, CLUSTER, (ROW_RANK, KEEPER_RANK, CLUSTER))
        return join_small(frame, decisions, on=[SAMPLE_ID], name="image_dedup.decisions").map_batches(
            MarkAlive(p.keep_by, mark), name="image_dedup.mark").light()

    def _with_lake_edges(self, new_edges: Frame, context: OperatorContext) -> tuple[Frame, pa.Array | None, Frame | None]:
        """Add the index rows of earlier runs' kept images that share a band key with a new image (read on the
        engine: ``operators.dedup.index.read_index``)."""
        new_keys = new_edges.groupby_agg([BAND_KEY], {"n": (SAMPLE_ID, "count")}).map_batches(
            Select((BAND_KEY,)), name="image_dedup.new_band_keys")
        index = read_index(context, IMAGE_INDEX, columns=[SAMPLE_ID, BAND_KEY, "image_hash"],
                           params_hash=self.index_params_hash, among=(BAND_KEY, new_keys), schema=IMAGE_INDEX_SCHEMA)
        if index is None:
            return new_edges, None, None
        match, known = index
        matched = match.to_arrow()  # only lake images sharing a band key with a new one: small
        if not matched.num_rows:
            return new_edges, None, known
        matched = matched.select([SAMPLE_ID, BAND_KEY, "image_hash"]).rename_columns([SAMPLE_ID, BAND_KEY, HASH]).cast(
            pa.schema([(SAMPLE_ID, pa.string()), (BAND_KEY, pa.int64()), (HASH, pa.int64())]))
        lake_ids = pc.unique(matched.column(SAMPLE_ID).combine_chunks())
        return new_edges.union(context.from_arrow(matched)), lake_ids, known

    def _index_rows(self, new_edges: Frame, decisions: Frame, repeated: int, known: Frame | None,
                    context: OperatorContext) -> Frame:
        """``image_index`` rows: every band key of every kept new image, each exactly once."""
        lost = decisions.map_batches(_LostSamples(), name="image_dedup.lost")
        rows = join_small(new_edges, lost, on=[SAMPLE_ID], how="left_anti", name="image_dedup.kept_edges")
        if known is not None:  # --full: never repeat an image the index lists
            seen = known.groupby_agg([SAMPLE_ID], {"n": (SAMPLE_ID, "count")}, having=Select((SAMPLE_ID,)))
            rows = join_small(rows, seen, on=[SAMPLE_ID], how="left_anti", name="image_dedup.not_indexed")
        if repeated:
            rows = rows.groupby_agg([SAMPLE_ID, BAND_KEY], {HASH: (HASH, "min")})
        return rows.map_batches(IndexRows(self.index_params_hash, context.run_id), name="image_dedup.index_rows")


class _LostSamples:
    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        lost = pc.fill_null(pc.not_equal(rank_sample_ids(table.column(KEEPER_RANK)), table.column(SAMPLE_ID)), False)
        lost = pc.or_(lost, pc.fill_null(is_lake_rank(table.column(KEEPER_RANK)), False))
        return table.filter(lost).select([SAMPLE_ID])


class _OwnCluster:
    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        return pa.table({SAMPLE_ID: table.column(SAMPLE_ID), CLUSTER: table.column(SAMPLE_ID),
                         KEEPER_RANK: table.column(KEEPER_RANK)})

"""``exact_dedup``: drop rows whose normalized text equals an earlier kept sample's.

Key: xxh3-128 of the normalized text (``operators.dedup.exact``). Per key the keep rule
of ``operators.dedup.ranking`` picks one row (samples already in the lake's ``exact_index``
always win); the others are dropped as ``exact_duplicate`` with lineage ref
``{"dup_of", "cluster_id" (the content hash), "method": "exact"}``. Kept samples are added
to ``exact_index``. Only live rows take part; dropped and quarantined rows pass through.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import GlobalOperator, OperatorContext, register
from operators.dedup.exact import hex_digests, value_hashes
from operators.dedup.index import EXACT_INDEX, read_index
from operators.dedup.normalize import Normalization, normalize_texts
from operators.dedup.params import ExactDedupParams
from operators.dedup.ranking import is_lake_rank, lake_ranks, row_ranks
from operators.dedup.steps import KEEPER_RANK, ROW_RANK, KeepAlive, MarkAlive, MarkByKeeper, Select, SharedKeys, join_small

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

CONTENT_HASH = "_dedup_content_hash"
SAMPLE_ID = "sample_id"


@dataclass(frozen=True)
class AddContentHash:
    """Adds the content hash and the row rank. Texts that normalize to nothing get a
    per-row key instead (they are not duplicates of each other, only of nothing)."""

    normalization: Normalization
    keep_by: str | None

    def __call__(self, table: pa.Table) -> pa.Table:
        ranks = row_ranks(table, self.keep_by)
        normalized = normalize_texts(table.column("text"), self.normalization)
        hashes = hex_digests(value_hashes(normalized))
        empty = pc.equal(pc.utf8_length(pc.fill_null(normalized, "")), 0)
        hashes = pc.if_else(empty, pc.binary_join_element_wise("empty:", ranks, ""), hashes)
        return table.append_column(CONTENT_HASH, hashes).append_column(ROW_RANK, ranks)


@dataclass(frozen=True)
class ExactIndexRows:
    """``exact_index`` rows of the kept rows (the keeper of each key, unless the lake's).

    Input: ``(sample_id, content hash, row rank)`` left-joined with the keeper rank of keys
    shared by several rows.
    """

    params_hash: str
    run_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        keeper = table.column(KEEPER_RANK)  # null: the key's only row, so kept
        kept = pc.and_(pc.fill_null(pc.equal(table.column(ROW_RANK), keeper), True),
                       pc.invert(pc.starts_with(table.column(CONTENT_HASH), "empty:")))
        rows = table.filter(pc.and_(kept, pc.invert(pc.fill_null(is_lake_rank(keeper), False))))
        n = rows.num_rows
        return pa.table({
            "content_hash": pc.cast(rows.column(CONTENT_HASH), pa.string()),
            "sample_id": pc.cast(rows.column("sample_id"), pa.string()),
            "params_hash": pa.array([self.params_hash] * n, pa.string()),
            "run_id": pa.array([self.run_id] * n, pa.string()),
        })


@register
class ExactDedup(GlobalOperator[ExactDedupParams]):
    """Exact duplicates after normalization (NFKC, lowercase, punctuation, whitespace)."""

    name = "exact_dedup"
    version = "1"
    Params = ExactDedupParams
    params: ExactDedupParams
    index_table: ClassVar[str] = EXACT_INDEX
    # chat, preference and trajectory samples carry their canonical rendering in ``text`` (datahub.kinds.posttraining)
    kinds: ClassVar[frozenset[str]] = frozenset({"text", "chat", "preference", "trajectory"})

    @property
    def index_params_hash(self) -> str:
        """What the index keys depend on: the normalization only (not keep_by/incremental)."""
        payload = json.dumps({"op": self.name, "v": self.version, "normalization": self.params.normalization.model_dump()},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def content_hash_step(self) -> Callable[[pa.Table], pa.Table]:
        """The key function: adds ``CONTENT_HASH`` and ``ROW_RANK`` to a batch (a subclass may key on other content)."""
        return AddContentHash(self.params.normalization.build(), self.params.keep_by)

    def apply(self, frame: Frame, context: OperatorContext) -> Frame:
        p = self.params
        # The documents are held once (``reusable``), next to one narrow row per document (id,
        # key, rank); only the keys go through the shuffle that finds shared ones, and the
        # decisions of shared keys (a small share) come back to the documents by a broadcast join.
        frame = frame.reusable()
        if frame.count() == 0:  # no record at all (empty inputs): nothing to compare, and no columns to key on
            return frame
        keyed = frame.map_batches(KeepAlive(alive=True), name="exact_dedup.alive").map_batches(
            self.content_hash_step(), name="exact_dedup.content_hash"
        ).map_batches(Select((SAMPLE_ID, CONTENT_HASH, ROW_RANK)), name="exact_dedup.keys").materialize()
        if keyed.count() == 0:
            return frame
        hashes = keyed.map_batches(Select((CONTENT_HASH,)), name="exact_dedup.hashes")
        if p.incremental:
            shared, lake_rows, known = self._shared_with_lake(hashes, context)
        else:  # keys of more than one new row
            shared = hashes.groupby_agg([CONTENT_HASH], {"rows": (CONTENT_HASH, "count")},
                                        having=SharedKeys(CONTENT_HASH, "rows")).materialize()
            lake_rows, known = None, None
        candidates = join_small(keyed, shared, on=[CONTENT_HASH], how="inner", name="exact_dedup.shared_rows")
        candidates = candidates.map_batches(Select((CONTENT_HASH, ROW_RANK)), name="exact_dedup.candidates")
        if lake_rows is not None:
            candidates = candidates.union(lake_rows)
        keepers = candidates.groupby_agg([CONTENT_HASH], {KEEPER_RANK: (ROW_RANK, "min")}).materialize()
        joined = join_small(keyed, keepers, on=[CONTENT_HASH], name="exact_dedup.keepers")  # keeper null: a key's only row
        context.checkpoint("exact_dedup:after_keepers")
        index_rows = joined.map_batches(ExactIndexRows(self.index_params_hash, context.run_id), name="exact_dedup.index_rows")
        if known is not None:  # --full: never repeat a row the index has
            index_rows = join_small(index_rows, known, on=["content_hash", "sample_id"], how="left_anti",
                                    name="exact_dedup.not_indexed")
        context.add_side_output(EXACT_INDEX, index_rows)
        # Rows of one sample_id have one text, so one key and one keeper: decisions per sample.
        decisions = joined.map_batches(_InSharedGroup(), name="exact_dedup.in_shared").groupby_agg(
            [SAMPLE_ID], {CONTENT_HASH: (CONTENT_HASH, "min"), KEEPER_RANK: (KEEPER_RANK, "min")}).materialize()
        mark = MarkByKeeper(self.op_id, "exact_duplicate", "exact", CONTENT_HASH, (CONTENT_HASH, ROW_RANK, KEEPER_RANK))
        return join_small(frame, decisions, on=[SAMPLE_ID], name="exact_dedup.decisions").map_batches(
            MarkAlive(p.keep_by, mark), name="exact_dedup.mark").light()

    def _shared_with_lake(self, hashes: Frame, context: OperatorContext) -> tuple[Frame, Frame | None, Frame | None]:
        """Keys of more than one row, counting the lake's ``exact_index``; the lake's rows of those keys (content
        hash and lake rank); the index rows of the new keys (``read_index``'s ``already_indexed``), or None.

        Only index rows whose content hash a new row holds are read (on the engine): a key no new row holds
        decides nothing."""
        counts = hashes.groupby_agg([CONTENT_HASH], {"rows": (CONTENT_HASH, "count")}).materialize()
        shared = counts.map_batches(SharedKeys(CONTENT_HASH, "rows"), name="exact_dedup.shared_keys")
        new_keys = counts.map_batches(Select((CONTENT_HASH,), ((CONTENT_HASH, "content_hash"),)), name="exact_dedup.new_keys")
        index = read_index(context, EXACT_INDEX, columns=["content_hash", "sample_id"], params_hash=self.index_params_hash,
                           among=("content_hash", new_keys))
        if index is None:
            return shared.materialize(), None, None
        match, known = index
        lake_rows = match.map_batches(_LakeRows(), name="exact_dedup.lake_rows").materialize()
        if lake_rows.count() == 0:
            return shared.materialize(), None, known
        in_lake = lake_rows.map_batches(Select((CONTENT_HASH,)), name="exact_dedup.lake_keys")
        shared = shared.union(in_lake).groupby_agg([CONTENT_HASH], {"n": (CONTENT_HASH, "count")},
                                                   having=Select((CONTENT_HASH,))).materialize()
        return shared, lake_rows, known


class _LakeRows:
    """Index rows as candidates: content hash and the lake rank of the sample (``ranking.lake_ranks``)."""

    def __call__(self, table: pa.Table) -> pa.Table:
        return pa.table({CONTENT_HASH: pc.cast(table.column("content_hash"), pa.string()),
                         ROW_RANK: pc.cast(lake_ranks(table.column("sample_id")), pa.string())})


class _InSharedGroup:
    def __call__(self, table: pa.Table) -> pa.Table:
        return table.filter(pc.is_valid(table.column(KEEPER_RANK))).select([SAMPLE_ID, CONTENT_HASH, KEEPER_RANK])

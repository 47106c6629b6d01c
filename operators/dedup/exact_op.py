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
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import GlobalOperator, register
from datahub.pipeline.faults import checkpoint
from operators.dedup.exact import content_hash_hex
from operators.dedup.index import EXACT_INDEX, read_index
from operators.dedup.normalize import Normalization, normalize_texts
from operators.dedup.params import ExactDedupParams
from operators.dedup.ranking import is_lake_rank, lake_ranks, row_ranks
from operators.dedup.steps import KEEPER_RANK, ROW_RANK, KeepAlive, MarkByKeeper, Select

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.pipeline.context import RunContext

CONTENT_HASH = "_dedup_content_hash"


@dataclass(frozen=True)
class AddContentHash:
    """Adds the content hash and the row rank. Texts that normalize to nothing get a
    per-row key instead (they are not duplicates of each other, only of nothing)."""

    normalization: Normalization
    keep_by: str | None

    def __call__(self, table: pa.Table) -> pa.Table:
        ranks = row_ranks(table, self.keep_by)
        hashes = content_hash_hex(table.column("text"), self.normalization)
        empty = pc.equal(pc.utf8_length(pc.fill_null(normalize_texts(table.column("text"), self.normalization), "")), 0)
        hashes = pc.if_else(empty, pc.binary_join_element_wise("empty:", ranks, ""), hashes)
        return table.append_column(CONTENT_HASH, hashes).append_column(ROW_RANK, ranks)


@dataclass(frozen=True)
class ExactIndexRows:
    """``exact_index`` rows of the kept rows (the keeper of each key, unless the lake's)."""

    params_hash: str
    run_id: str

    def __call__(self, table: pa.Table) -> pa.Table:
        kept = pc.and_(pc.equal(table.column(ROW_RANK), table.column(KEEPER_RANK)),
                       pc.invert(pc.starts_with(table.column(CONTENT_HASH), "empty:")))
        rows = table.filter(pc.and_(kept, pc.invert(is_lake_rank(table.column(KEEPER_RANK)))))
        n = rows.num_rows
        return pa.table({
            "content_hash": pc.cast(rows.column(CONTENT_HASH), pa.string()),
            "sample_id": pc.cast(rows.column("sample_id"), pa.string()),
            "params_hash": pa.array([self.params_hash] * n, pa.string()),
            "run_id": pa.array([self.run_id] * n, pa.string()),
        })


@register
class ExactDedup(GlobalOperator):
    """Exact duplicates after normalization (NFKC, lowercase, punctuation, whitespace)."""

    name = "exact_dedup"
    version = "1"
    Params = ExactDedupParams
    params: ExactDedupParams
    index_table: ClassVar[str] = EXACT_INDEX

    @property
    def index_params_hash(self) -> str:
        """What the index keys depend on: the normalization only (not keep_by/incremental)."""
        payload = json.dumps({"op": self.name, "v": self.version, "normalization": self.params.normalization.model_dump()},
                             sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def apply(self, frame: Frame, context: RunContext) -> Frame:
        p = self.params
        frame = frame.materialize()
        dead = frame.map_batches(KeepAlive(alive=False), name="exact_dedup.pass_through")
        hashed = frame.map_batches(KeepAlive(alive=True), name="exact_dedup.alive").map_batches(
            AddContentHash(p.normalization.build(), p.keep_by), name="exact_dedup.content_hash"
        ).materialize()
        if hashed.count() == 0:
            return frame
        candidates = hashed.map_batches(Select((CONTENT_HASH, ROW_RANK)), name="exact_dedup.candidates")
        known = None
        if p.incremental:
            match, known = read_index(context, EXACT_INDEX, columns=["content_hash", "sample_id"],
                                      params_hash=self.index_params_hash)
            if match.num_rows:
                lake_rows = pa.table({CONTENT_HASH: match.column("content_hash"), ROW_RANK: lake_ranks(match.column("sample_id"))})
                candidates = candidates.union(context.engine.from_arrow(lake_rows))
        keepers = candidates.groupby_agg([CONTENT_HASH], {KEEPER_RANK: (ROW_RANK, "min")})
        joined = hashed.join(keepers, on=[CONTENT_HASH]).materialize()
        checkpoint("exact_dedup:after_keepers")
        index_rows = joined.map_batches(ExactIndexRows(self.index_params_hash, context.run_id), name="exact_dedup.index_rows")
        if known is not None and known.num_rows:  # --full: never repeat a row the index has
            seen = pa.table({"content_hash": known.column("content_hash"), "sample_id": known.column("sample_id")})
            index_rows = index_rows.join(context.engine.from_arrow(seen), on=["content_hash", "sample_id"], how="left_anti")
        context.add_side_output(EXACT_INDEX, index_rows.materialize())
        marked = joined.map_batches(
            MarkByKeeper(self.op_id, "exact_duplicate", "exact", CONTENT_HASH, (CONTENT_HASH, ROW_RANK, KEEPER_RANK)),
            name="exact_dedup.mark",
        )
        return marked.union(dead)

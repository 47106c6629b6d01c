"""Small picklable batch functions the dedup operators pass to ``Frame.map_batches``.

Each is a frozen dataclass (pickles to Ray and Spark workers by value) doing one pyarrow
step; the operators compose them. No engine imports here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import DROP_OP, DROP_REASON, DROP_REF, QUARANTINED, Operator
from operators.dedup.ranking import is_lake_rank, rank_sample_ids

if TYPE_CHECKING:
    from datahub.engines.frame import Frame

KEEPER_RANK = "_dedup_keeper_rank"
ROW_RANK = "_dedup_rank"


def alive_mask(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Rows that take part in dedup: not dropped and not quarantined."""
    alive = pc.is_null(table.column(DROP_REASON)) if DROP_REASON in table.column_names \
        else pa.array([True] * table.num_rows, pa.bool_())  # typed: an empty batch too
    if QUARANTINED in table.column_names:
        alive = pc.and_(alive, pc.invert(pc.fill_null(table.column(QUARANTINED), False)))
    return alive


@dataclass(frozen=True)
class KeepAlive:
    """Only rows that take part (``alive=True``) or only the others (``alive=False``)."""

    alive: bool = True

    def __call__(self, table: pa.Table) -> pa.Table:
        mask = alive_mask(table)
        return table.filter(mask if self.alive else pc.invert(mask))


@dataclass(frozen=True)
class Select:
    """Project (and rename ``(old, new)`` pairs of) columns."""

    columns: tuple[str, ...]
    renames: tuple[tuple[str, str], ...] = ()

    def __call__(self, table: pa.Table) -> pa.Table:
        table = table.select(list(self.columns))
        mapping = dict(self.renames)
        return table.rename_columns([mapping.get(c, c) for c in table.column_names])


@dataclass(frozen=True)
class Distinct:
    """Drop rows repeated within a batch (a cheap pre-pass before a global groupby)."""

    columns: tuple[str, ...]

    def __call__(self, table: pa.Table) -> pa.Table:
        if not table.num_rows:
            return table.select(list(self.columns))
        return table.group_by(list(self.columns), use_threads=False).aggregate([])


@dataclass(frozen=True)
class SharedKeys:
    """``having`` of a count: the keys of groups with more than one row (shared band keys, content
    hashes held twice, sample ids in several rows)."""

    key: str
    count: str

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.filter(pc.greater(table.column(self.count), 1)).select([self.key])


@dataclass(frozen=True)
class NotEqual:
    """Rows where two columns differ."""

    left: str
    right: str

    def __call__(self, table: pa.Table) -> pa.Table:
        return table.filter(pc.fill_null(pc.not_equal(table.column(self.left), table.column(self.right)), True))


def json_refs(*, dup_of: pa.Array | pa.ChunkedArray, cluster_id: pa.Array | pa.ChunkedArray,
              method: pa.Array | pa.ChunkedArray, jaccard: pa.Array | pa.ChunkedArray | None = None,
              keeper_in_lake: pa.Array | pa.ChunkedArray | None = None) -> pa.Array | pa.ChunkedArray:
    """The lineage ``ref`` JSON per row, built vectorized.

    Ids are hex digests (sample ids, content hashes) and methods are fixed words, so no
    JSON escaping is needed; ``jaccard`` is rounded to 4 decimals, omitted where null.
    """
    n = len(dup_of)
    parts: list[pa.Array | pa.ChunkedArray | str] = [
        pa.array(['{"dup_of": "'] * n, pa.string()), dup_of,
        '", "cluster_id": "', pc.cast(cluster_id, pa.string()),
        '", "method": "', method, '"',
    ]
    if jaccard is not None:
        rounded = pc.cast(pc.round(pc.cast(jaccard, pa.float64()), 4), pa.string())
        parts.append(pc.fill_null(pc.binary_join_element_wise(', "jaccard": ', rounded, ""), ""))
    if keeper_in_lake is not None:
        flag = pc.if_else(pc.fill_null(keeper_in_lake, False), pa.scalar(', "keeper_in_lake": true'), pa.scalar(""))
        parts.append(flag)
    parts.append("}")
    return pc.binary_join_element_wise(*parts, "")


def string_columns(table: pa.Table) -> pa.Table:
    """large_string -> string (Ray joins widen strings; the samples schema uses string)."""
    fields = [pa.field(f.name, pa.string()) if pa.types.is_large_string(f.type) else f for f in table.schema]
    target = pa.schema(fields, metadata=table.schema.metadata)
    return table if target == table.schema else table.cast(target)


@dataclass(frozen=True)
class MarkByKeeper:
    """Mark rows whose rank is not their group's keeper rank as dropped, with lineage refs.

    Input columns: the rows, ``ROW_RANK``, ``KEEPER_RANK`` (null: not clustered, kept), the
    ``cluster`` column, and optionally ``jaccard``. Output: the original columns only.
    """

    op_id: str
    reason: str
    method: str
    cluster_column: str
    drop_columns: tuple[str, ...]
    same_sample_reason: str = "exact_duplicate"

    def __call__(self, table: pa.Table) -> pa.Table:
        table = string_columns(table)
        if not table.num_rows:
            return string_columns(table.drop_columns([c for c in self.drop_columns if c in table.column_names]))
        keeper_rank = table.column(KEEPER_RANK)
        mask = pc.fill_null(pc.not_equal(table.column(ROW_RANK), keeper_rank), False)
        keeper = rank_sample_ids(keeper_rank)
        same_sample = pc.fill_null(pc.equal(keeper, table.column("sample_id")), False)
        # Rows of one sample_id (same text, two files) are exact copies whatever the method.
        reason = pc.if_else(same_sample, pa.scalar(self.same_sample_reason), pa.scalar(self.reason))
        method = pc.if_else(same_sample, pa.scalar("exact"), pa.scalar(self.method))
        refs = json_refs(
            dup_of=keeper,
            cluster_id=table.column(self.cluster_column),
            method=method,
            jaccard=table.column("jaccard") if "jaccard" in table.column_names else None,
            keeper_in_lake=is_lake_rank(keeper_rank),
        )
        marked = Operator.mark_dropped(table, mask, reason, ref=refs)
        current_op = marked.column(DROP_OP) if DROP_OP in marked.column_names else pa.nulls(marked.num_rows, pa.string())
        drop_op = pc.if_else(mask, pa.scalar(self.op_id), current_op)
        marked = _set(marked, DROP_OP, drop_op)
        if DROP_REF not in marked.column_names:
            marked = marked.append_column(DROP_REF, pa.nulls(marked.num_rows, pa.string()))
        return string_columns(marked.drop_columns([c for c in self.drop_columns if c in marked.column_names]))


def _set(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


# A side of at most this many rows is shipped whole to every partition instead of shuffled (``join_small``).
BROADCAST_ROWS = 1_000_000


@dataclass(frozen=True)
class BroadcastJoin:
    """Batch function: join each batch with a small table every worker holds whole."""

    right: pa.Table
    on: tuple[str, ...]
    how: str

    def __call__(self, table: pa.Table) -> pa.Table:
        from datahub.engines.kernels import join_tables

        if any(key not in table.column_names for key in self.on):  # an empty block may carry no columns
            return table
        return join_tables(table, self.right, list(self.on), self.how)


def join_small(frame: Frame, small: Frame, *, on: list[str], how: Literal["inner", "left", "left_anti"] = "left",
               name: str = "broadcast_join") -> Frame:
    """``frame.join(small)`` without moving ``frame``'s rows when ``small`` has at most ``BROADCAST_ROWS`` rows.

    Dedup decisions (clustered or repeated samples) are a small share of the documents: joining
    them into the wide document table by broadcast keeps one copy of the texts, where a hash
    join would write the texts through a shuffle. Larger sides take the hash join.
    """
    if small.count() > BROADCAST_ROWS:
        return frame.join(small, on=on, how=how)
    return frame.map_batches(BroadcastJoin(small.to_arrow(), tuple(on), how), name=name)


@dataclass(frozen=True)
class MarkAlive:
    """``MarkByKeeper`` over documents left-joined with per-sample decisions (``KEEPER_RANK`` etc.).

    Computes each row's rank (``ranking.row_ranks``) here; rows that do not take part (already
    dropped or quarantined) lose their decision and pass through unchanged.
    """

    keep_by: str | None
    mark: MarkByKeeper

    def __call__(self, table: pa.Table) -> pa.Table:
        from operators.dedup.ranking import row_ranks

        if not table.num_rows or KEEPER_RANK not in table.column_names:
            return self.mark(table)
        alive = alive_mask(table)
        keeper = pc.if_else(alive, table.column(KEEPER_RANK), pa.scalar(None, table.schema.field(KEEPER_RANK).type))
        table = _set(table, KEEPER_RANK, keeper)
        return self.mark(table.append_column(ROW_RANK, row_ranks(table, self.keep_by)))

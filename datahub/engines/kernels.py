"""Single-partition pyarrow kernels behind every Frame's groupby and join.

ArrowFrame runs them on the whole table; RayFrame runs them per hash partition after its
shuffle. One implementation, so both engines give the same rows and column order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from datahub.engines.frame import Aggregate

_JOIN_TYPES = {"inner": "inner", "left": "left outer", "left_anti": "left anti"}
_LEFT_ROW, _RIGHT_ROW = "__datahub_left_row", "__datahub_right_row"


def aggregate_table(table: pa.Table, keys: list[str], aggregations: dict[str, tuple[str, Aggregate]]) -> pa.Table:
    """Group by ``keys``: columns = keys, then ``{out: (column, kind)}``; count = rows per group."""
    specs: list[tuple[Any, str]] = []
    for column, kind in aggregations.values():
        spec = ([], "count_all") if kind == "count" else (column, kind)
        if spec not in specs:
            specs.append(spec)
    grouped = table.group_by(keys, use_threads=False).aggregate(specs)
    # pyarrow names an aggregate "{column}_{kind}" ("count_all" for a row count)
    columns = {key: grouped.column(key) for key in keys}
    for out, (column, kind) in aggregations.items():
        columns[out] = grouped.column("count_all" if kind == "count" else f"{column}_{kind}")
    return pa.table(columns)


def join_tables(left: pa.Table, right: pa.Table, on: list[str], how: str) -> pa.Table:
    """Hash join on ``on``: the left's columns, then the right's other columns.

    Acero joins only key columns and row numbers; full rows are gathered with ``take``, so
    non-key columns of any type (the ``quality`` struct) come along. Null keys never match.
    """
    left_keys = left.select(on).append_column(_LEFT_ROW, pa.array(np.arange(left.num_rows, dtype=np.int64)))
    right_keys = right.select(on).append_column(_RIGHT_ROW, pa.array(np.arange(right.num_rows, dtype=np.int64)))
    if how == "left_anti":
        matched = left_keys.join(right_keys.select(on), on, join_type="left anti", use_threads=False)
        return left.take(matched.column(_LEFT_ROW).combine_chunks().sort())
    joined = left_keys.join(right_keys, on, join_type=_JOIN_TYPES[how], use_threads=False)
    joined = joined.sort_by([(_LEFT_ROW, "ascending"), (_RIGHT_ROW, "ascending")])  # deterministic order
    result = left.take(joined.column(_LEFT_ROW))
    extra = [c for c in right.column_names if c not in on]
    if extra:
        taken = right.select(extra).take(joined.column(_RIGHT_ROW))  # null index -> null row (left join)
        for name in extra:
            if name in result.column_names:
                raise ValueError(f"join on {on}: both sides have a column {name!r}; rename it on one side first")
            result = result.append_column(name, taken.column(name))
    return result

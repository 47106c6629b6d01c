"""Keep one-sample lineage lookups fast as commits pile up: Z-order ``lineage`` by sample_id.

Every commit is sorted by sample_id but spans the whole id range, so a lookup touches one
row group per commit file; rewriting the files clustered by sample_id (delta-rs
``optimize.z_order``) makes file statistics disjoint, and a lookup reads about one file.
Old files stay for time travel until ``vacuum`` (never run implicitly).
"""

from __future__ import annotations

from typing import Any

from datahub.lake.lake import Lake, writer_properties
from datahub.lineage.query import LINEAGE_TABLE


# Small row groups let Parquet statistics skip all but ~one group per file on a point lookup
# (measured in benchmarks/lineage.py).
ROW_GROUP_ROWS = 32_768


def optimize_lineage(lake: Lake, *, target_size: int | None = None, row_group_rows: int = ROW_GROUP_ROWS) -> dict[str, Any]:
    """Z-order the lineage table by sample_id, in small row groups; returns delta-rs's metrics."""
    table = lake.table(LINEAGE_TABLE)
    metrics = table.optimize.z_order(["sample_id"], target_size=target_size,
                                     writer_properties=writer_properties(row_group_rows))
    return {"version": lake.table(LINEAGE_TABLE).version(), **metrics}

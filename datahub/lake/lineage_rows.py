"""The one builder of ``lineage`` rows: every writer of lineage events (the run's sinks, release freeze,
merge, redact, export, tier copies) makes its rows here, so the table's schema and conventions live in one place.

It sits beside the ``LINEAGE`` schema in the lake layer (not in ``datahub.lineage``, which reads lineage and
sits above the pipeline) so that the pipeline can use it without an upward import.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TypeAlias

import pyarrow as pa

from datahub.lake.tables import LINEAGE, LINEAGE_ACTIONS

_TS = pa.timestamp("us", tz="UTC")

Column: TypeAlias = "str | None | pa.Array | pa.ChunkedArray"


def _column(value: Column, n: int) -> pa.Array | pa.ChunkedArray:
    """A string column of ``n`` rows: a scalar repeated (None as nulls) or an array of length ``n``."""
    if value is None:
        return pa.nulls(n, pa.string())
    if isinstance(value, str):
        return pa.repeat(pa.scalar(value, pa.string()), n)
    if len(value) != n:
        raise ValueError(f"lineage column has {len(value)} values for {n} sample ids")
    return value.cast(pa.string()) if value.type != pa.string() else value


def lineage_rows(
    sample_ids: pa.Array | pa.ChunkedArray,
    *,
    run_id: str,
    op: Column,
    action: str,
    params_hash: Column = None,
    reason: Column = None,
    ref: Column = None,
    ts: datetime | None = None,
    sort: bool = True,
) -> pa.Table:
    """One ``lineage`` row per sample id, in the ``LINEAGE`` schema.

    ``run_id`` and ``action`` are the same for every row; ``op``, ``params_hash``, ``reason`` and ``ref`` are a
    scalar (repeated), None (nulls) or an array aligned with ``sample_ids``. ``ts`` defaults to now (UTC).
    Rows are sorted by ``sample_id`` unless ``sort=False``: file min/max stats then narrow one sample's lookup.
    """
    if action not in LINEAGE_ACTIONS:
        raise ValueError(f"lineage action {action!r} is not one of {', '.join(LINEAGE_ACTIONS)}")
    n = len(sample_ids)
    when = ts if ts is not None else datetime.now(timezone.utc)
    table = pa.table(
        {
            "sample_id": sample_ids.cast(pa.string()) if sample_ids.type != pa.string() else sample_ids,
            "run_id": _column(run_id, n),
            "op": _column(op, n),
            "params_hash": _column(params_hash, n),
            "action": _column(action, n),
            "reason": _column(reason, n),
            "ref": _column(ref, n),
            "ts": pa.repeat(pa.scalar(when, _TS), n),
        },
        schema=LINEAGE,
    )
    return table.sort_by([("sample_id", "ascending")]) if sort and n > 1 else table

"""Dedup indexes in the lake, so a later run dedups against everything already kept.

- ``minhash_index``: one row per (kept sample, LSH band): ``sample_id, band_key, params_hash, run_id``.
- ``exact_index``: one row per kept sample: ``content_hash, sample_id, params_hash, run_id``.

Rows are written as run side outputs (committed with the run's idempotent txn after the
samples, quarantine and lineage), only for samples the operator kept. ``params_hash``
covers everything that changes a key (normalization, shingling, permutations, bands), so
a run with other params ignores rows it could not match anyway.

Which rows a run dedups against: every row with its params hash, except the run's own
(a re-run after a crash between commits must not find itself) and, on ``--full``, the
rows of this job's earlier runs (run ids ``{job}-...``: the job's samples are being replaced).

``--full`` and the index (decision: filter, not overwrite): side outputs are appended, so a
``--full`` run writes index rows only for kept samples the index does not list yet under
this params hash. Repeated ``--full`` runs therefore never duplicate index rows; a sample
the full run no longer keeps keeps its old index row (an incremental run may then name it
as ``dup_of``; its lineage still explains where it went).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

if TYPE_CHECKING:
    from datahub.operator import OperatorContext

MINHASH_INDEX = "minhash_index"
EXACT_INDEX = "exact_index"
MINHASH_INDEX_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("band_key", pa.int64()), ("params_hash", pa.string()), ("run_id", pa.string())]
)
EXACT_INDEX_SCHEMA = pa.schema(
    [("content_hash", pa.string()), ("sample_id", pa.string()), ("params_hash", pa.string()), ("run_id", pa.string())]
)


def read_index(context: OperatorContext, table: str, *, columns: list[str], params_hash: str) -> tuple[pa.Table, pa.Table]:
    """``(match_against, already_indexed)`` rows of ``table`` with ``params_hash``.

    ``match_against``: the rows new samples dedup against (see the module docstring).
    ``already_indexed``: every row but this run's own, so side outputs never repeat a row.
    """
    wanted = list(dict.fromkeys([*columns, "run_id"]))
    if not context.lake.exists(table):
        empty = pa.schema([f for f in _schema(table) if f.name in wanted]).empty_table()
        return empty, empty
    rows = context.lake.read(table, columns=wanted, filters=ds.field("params_hash") == params_hash)
    rows = rows.filter(pc.not_equal(rows.column("run_id"), context.run_id))
    match = rows
    if context.full:
        own_job = pc.starts_with(rows.column("run_id"), f"{context.job_name}-")
        match = rows.filter(pc.invert(own_job))
    return match, rows


def _schema(table: str) -> pa.Schema:
    return MINHASH_INDEX_SCHEMA if table == MINHASH_INDEX else EXACT_INDEX_SCHEMA

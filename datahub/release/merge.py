"""``release.merge``: combine releases into a new one, deduplicated across them, optionally weighted.

Dedup (``release.merge_dedup``) is exact (the ``operators.dedup.exact`` content hash) by default
or near (the MinHash-LSH kernels of ``minhash_dedup``); the first copy wins, in ``--from`` order,
and each dropped row's lineage names its ``dup_of`` and the release that kept it.
Weights fix the mixture of the output: with per-source counts ``c`` (after dedup) and
normalized weights ``w``, the output has ``N = min(c_s / w_s)`` rows, ``floor(w_s * N)`` from
each source (no source is upsampled), picked by the smallest seeded hash of sample_id
(deterministic, order-independent). The rows are materialized in the Delta table
``release_<NEW>`` with a ``release_source`` column naming the input release of each row;
lineage records the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.lake.tables import LINEAGE
from datahub.release.digest import id_keys
from datahub.release.freeze import freeze, refuse_taken, release_txn
from datahub.release.materialize import commit_rows
from datahub.release.merge_dedup import SOURCE_COLUMN, DedupMode, Duplicates, dedup_keyed, dedup_rows, exact_keys
from datahub.release.records import MATERIALIZED_PREFIX, Release, check_name, get_release, read_release

MERGE_OP = "release.merge@1"


def parse_weights(text: str | None) -> dict[str, float] | None:
    """``"A=0.7,B=0.3"`` -> {"A": 0.7, "B": 0.3}."""
    if not text:
        return None
    weights: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ReleaseError(f"--weights {text!r}: expected NAME=WEIGHT pairs, e.g. --weights A=0.7,B=0.3")
    return weights


def _dropped_lineage(dups: Duplicates | None, new: str, ts: datetime) -> pa.Table:
    """One ``dropped`` lineage row per duplicate: dup_of, the keeper's release, the method's fields."""
    if dups is None or not len(dups.sample_id):
        return LINEAGE.empty_table()
    refs = [
        json.dumps({"dup_of": d, "dup_release": dr, "release": new, "from": s, "method": dups.method, **extra})
        for d, dr, s, extra in zip(dups.dup_of.to_pylist(), dups.dup_release.to_pylist(), dups.source.to_pylist(),
                                   dups.extra)
    ]
    return lineage_rows(dups.sample_id, run_id=release_txn(new), op=MERGE_OP, action="dropped", reason=dups.reason,
                        ref=pa.array(refs, pa.string()), ts=ts)


def _sample(rows: pa.Table, weights: dict[str, float], sources: list[str], seed: int) -> tuple[pa.Table, dict[str, int]]:
    unknown = sorted(set(weights) - set(sources))
    missing = [s for s in sources if s not in weights]
    if unknown or missing:
        raise ReleaseError(f"--weights must name each --from release exactly: unknown {unknown}, missing {missing}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ReleaseError(f"--weights {weights}: weights must be >= 0 and not all 0")
    total = sum(weights.values())
    share = {s: weights[s] / total for s in sources}
    source_col = rows.column(SOURCE_COLUMN)
    counts = {s: int(pc.sum(pc.cast(pc.equal(source_col, s), pa.int64())).as_py() or 0) for s in sources}
    empty = [s for s in sources if share[s] > 0 and counts[s] == 0]
    if empty:
        raise ReleaseError(f"--weights: release(s) {empty} have no rows left after cross-release dedup, so no "
                           "mixture with those weights exists; give them weight 0 or merge with --no-dedup")
    size = min(counts[s] / share[s] for s in sources if share[s] > 0)
    quotas = {s: int(np.floor(share[s] * size + 1e-9)) for s in sources}
    keys = id_keys(rows.column("sample_id"), seed=seed)
    picks = []
    for s in sources:
        idx = np.flatnonzero(np.asarray(pc.equal(source_col, s).to_numpy(zero_copy_only=False)))
        order = idx[np.argsort(keys[idx], kind="stable")][: quotas[s]]
        picks.append(order)
    chosen = np.sort(np.concatenate(picks)) if picks else np.array([], dtype=np.int64)
    return rows.take(pa.array(chosen, pa.int64())), quotas


ROW_BATCH_ROWS = 2048  # whole rows read and written at a time (delta-rs buffers a row group)
ID_BATCH_ROWS = 8192
ROW_COLUMN = "_merge_position"  # a row's position in its input release's scan


def _narrow_dedup(lake: Lake, parents: list[Release], dedup: DedupMode) -> tuple[pa.Table, dict[str, int],
                                                                                 Duplicates | None]:
    """Pass 1: per input release, batch by batch, the ids, the exact-dedup key (from the text) and the row's
    position; the dedup decides on these narrow rows (about 100 bytes a row)."""
    parts, keys, counts = [], [], {}
    method = "sample_id"
    for parent in parents:
        dataset = lake.dataset(parent.table, parent.version)
        columns = ["sample_id"] + (["text"] if dedup == "exact" and "text" in dataset.schema.names else [])
        seen = 0
        for batch in scan_batches(dataset, columns=columns, batch_rows=ID_BATCH_ROWS):
            n = batch.num_rows
            parts.append(pa.table({"sample_id": batch.column("sample_id"), SOURCE_COLUMN: pa.repeat(parent.name, n),
                                   ROW_COLUMN: pa.array(np.arange(seen, seen + n, dtype=np.int64))}))
            if dedup == "exact":
                key, method = exact_keys(batch.column("sample_id"),
                                         batch.column("text") if "text" in batch.schema.names else None)
                keys.append(key)
            seen += n
        counts[parent.name] = seen
    schema = pa.schema([("sample_id", pa.string()), (SOURCE_COLUMN, pa.string()), (ROW_COLUMN, pa.int64())])
    rows = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    if dedup == "none":
        return rows, counts, None
    kept, dups = dedup_keyed(rows, pa.chunked_array(keys, pa.string()).combine_chunks() if keys else
                             pa.array([], pa.string()), method)
    return kept, counts, dups


def _merged_schema(datasets: list[Any]) -> pa.Schema:
    schemas = [pa.schema(dataset.schema) for dataset in datasets]
    schemas = [s.remove(s.get_field_index(SOURCE_COLUMN)) if SOURCE_COLUMN in s.names else s for s in schemas]
    return pa.unify_schemas([*schemas, pa.schema([(SOURCE_COLUMN, pa.string())])], promote_options="permissive")


def _kept_rows(parents: list[Release], datasets: list[Any], kept: pa.Table) -> Iterator[pa.Table]:
    """Pass 2: every column of the kept rows, input release by input release, in batches, in input order.
    Only pyarrow scans here (``datasets`` are opened before the commit), each file read without read-ahead."""
    schema = _merged_schema(datasets)
    for parent, dataset in zip(parents, datasets):
        mine = pc.equal(kept.column(SOURCE_COLUMN), parent.name)
        positions = np.sort(np.asarray(kept.column(ROW_COLUMN).filter(mine), dtype=np.int64))
        seen = 0
        for batch in scan_batches(dataset, batch_rows=ROW_BATCH_ROWS):
            n = batch.num_rows
            low, high = np.searchsorted(positions, [seen, seen + n])
            seen += n
            if low == high:
                continue
            rows = pa.Table.from_batches([batch]).take(pa.array(positions[low:high] - (seen - n)))
            if SOURCE_COLUMN in rows.column_names:  # merging a merge: the original input release is replaced
                rows = rows.drop_columns([SOURCE_COLUMN])
            rows = rows.append_column(SOURCE_COLUMN, pa.repeat(parent.name, rows.num_rows).cast(pa.string()))
            yield pa.table([rows.column(f.name).cast(f.type) if f.name in rows.column_names else
                            pa.nulls(rows.num_rows, f.type) for f in schema], schema=schema)


def merge_releases(
    lake: Lake,
    new: str,
    *,
    sources: list[str],
    weights: dict[str, float] | None = None,
    dedup: DedupMode = "exact",
    threshold: float = 0.8,
    verify: bool = True,
    seed: int = 0,
    creator: str | None = None,
) -> Release:
    """Merge releases ``sources`` into release ``new`` (rows materialized in ``release_<new>``).

    ``dedup``: ``exact`` (normalized content hash), ``near`` (MinHash-LSH at Jaccard ``threshold``,
    each drop confirmed by exact shingle Jaccard unless ``verify=False``) or ``none``.
    """
    check_name(new)
    refuse_taken(lake, new)
    if len(sources) < 1 or len(set(sources)) != len(sources):
        raise ReleaseError(f"merge {new!r}: give each input release once with --from (got {sources})")
    if dedup not in ("exact", "near", "none"):
        raise ReleaseError(f"--dedup {dedup!r}: expected exact, near or none")
    parents = [get_release(lake, s) for s in sources]
    ts = datetime.now(timezone.utc)
    table = MATERIALIZED_PREFIX + new
    if dedup == "near":  # MinHash over every text at once: the releases are held in memory
        parts = []
        for parent in parents:
            rows = read_release(lake, parent)
            if SOURCE_COLUMN in rows.column_names:  # merging a merge: keep the original input release
                rows = rows.drop_columns([SOURCE_COLUMN])
            parts.append(rows.append_column(SOURCE_COLUMN, pa.array([parent.name] * rows.num_rows, pa.string())))
        rows = pa.concat_tables(parts, promote_options="permissive")
        read_counts = {p.name: n.num_rows for p, n in zip(parents, parts)}
        before = rows.num_rows
        rows, dups = dedup_rows(rows, dedup, threshold=threshold, verify=verify)
    else:  # exact or none: decided on narrow rows (ids, keys), then the kept rows stream into the commit
        rows, read_counts, dups = _narrow_dedup(lake, parents, dedup)
        before = sum(read_counts.values())
    dropped = _dropped_lineage(dups, new, ts)
    method = dups.method if dups is not None else None
    removed = before - rows.num_rows
    quotas = None
    if weights:
        rows, quotas = _sample(rows, weights, sources, seed)
    if dedup == "near":
        lake.commit(table, rows, txn=release_txn(new), metadata={"datahub.release": new})
    else:
        kept = rows.select(["sample_id", SOURCE_COLUMN, ROW_COLUMN])
        rows = rows.select(["sample_id", SOURCE_COLUMN])
        datasets = [lake.dataset(p.table, p.version) for p in parents]
        # written here and committed as add actions: delta-rs's writer buffers up to a target-size file of rows
        commit_rows(lake, table, _kept_rows(parents, datasets, kept), txn=release_txn(new),
                    schema=_merged_schema(datasets), row_group_rows=ROW_BATCH_ROWS, metadata={"datahub.release": new})
    version = int(lake.table(table).version())
    details = {"sources": sources, "rows_read": read_counts, "dedup": dedup, "dedup_method": method,
               "duplicates_removed": removed, "duplicates_dropped": dropped.num_rows,
               "weights": weights, "seed": seed, "quotas": quotas}
    if dedup == "near":
        details.update(threshold=threshold, verify=verify)
    return freeze(
        lake, new, table=table, version=version, sample_ids=rows.column("sample_id"), kind="merge",
        qa_status="inherited", parents=sources, creator=creator, details=details, extra_lineage=dropped,
        run_ids=sorted({r for p in parents for r in p.run_ids}), jobs=sorted({j for p in parents for j in p.jobs}),
        released_reason=pc.binary_join_element_wise(pa.array(["merged_from:"] * rows.num_rows, pa.string()),
                                                   rows.column(SOURCE_COLUMN).combine_chunks(), ""),
    )

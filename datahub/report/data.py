"""Collect what the report shows from the lake: signals, drops, languages, clusters, sources."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.lake import Lake


@dataclass
class ReportData:
    table: str
    version: int
    rows: int
    signals: dict[str, np.ndarray] = field(default_factory=dict)  # numeric quality fields
    languages: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    drops: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op, reason) -> n
    cluster_sizes: list[int] = field(default_factory=list)
    qa: list[Any] = field(default_factory=list)
    quarantine: Counter[str] = field(default_factory=Counter)  # reason -> records, of the runs that wrote the table


BATCH_ROWS = 16_384


def collect(lake: Lake, *, table: str = "samples", version: int | None = None) -> ReportData:
    """Stream the columns the report shows (``quality``, ``source_uri``, ``ingest_run_id``; never ``text``) in
    batches. Held: the numeric signals as float32 (4 bytes a row each, for the histograms), counters of
    languages, sources, run ids and drop reasons."""
    if version is None:
        version = int(lake.table(table).version())
    dataset = lake.dataset(table, version)
    names = set(dataset.schema.names)
    columns = [c for c in ("quality", "source_uri", "ingest_run_id") if c in names]
    data = ReportData(table, version, 0)
    signals: dict[str, list[np.ndarray]] = {}
    run_ids: set[str] = set()
    batches = dataset.to_batches(columns=columns, batch_size=BATCH_ROWS, batch_readahead=1,
                                 fragment_readahead=1) if columns else iter(())
    for batch in batches:
        data.rows += batch.num_rows
        if "quality" in columns and pa.types.is_struct(batch.schema.field("quality").type):
            quality = batch.column("quality")
            for i, f in enumerate(quality.type):
                values = quality.field(i)
                if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
                    arr = np.asarray(pc.drop_null(values).to_numpy(zero_copy_only=False), dtype=np.float32)
                    signals.setdefault(f.name, []).append(arr[np.isfinite(arr)])
                elif f.name == "language":
                    counts = pc.value_counts(pc.drop_null(values))
                    data.languages.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))
        if "source_uri" in columns:
            counts = pc.value_counts(pc.drop_null(batch.column("source_uri")))
            for uri, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
                if uri:
                    data.sources[uri.rsplit("/", 1)[-1]] += n
        if "ingest_run_id" in columns:
            run_ids.update(v for v in pc.unique(batch.column("ingest_run_id")).to_pylist() if v is not None)
    if not columns:
        data.rows = dataset.count_rows()
    data.signals = {name: np.concatenate(parts) for name, parts in signals.items()}
    if lake.exists("lineage") and run_ids:
        members: Counter[str] = Counter()
        dropped = lake.dataset("lineage").to_batches(
            columns=["op", "reason", "ref"], batch_size=BATCH_ROWS, batch_readahead=1,
            filter=(pc.field("action") == "dropped") & pc.field("run_id").isin(sorted(run_ids)))
        for batch in dropped:
            data.drops.update(zip(batch.column("op").to_pylist(), batch.column("reason").to_pylist()))
            _count_clusters(batch.column("ref").to_pylist(), members)
        data.cluster_sizes = sorted(n + 1 for n in members.values())
    if lake.exists("quarantine") and run_ids:
        reasons = lake.read("quarantine", columns=["reason"], filters=pc.field("run_id").isin(sorted(run_ids)))
        data.quarantine.update(reasons.column("reason").to_pylist())
    from datahub.qa import results_for

    data.qa = results_for(lake, table=table, version=version)
    return data


def _count_clusters(refs: list[str | None], members: Counter[str]) -> None:
    """Add the dropped members of each duplicate cluster named by these refs."""
    for ref in refs:
        if not ref:
            continue
        try:
            parsed = json.loads(ref)
        except (TypeError, ValueError):
            continue
        key = parsed.get("cluster_id") or parsed.get("dup_of") if isinstance(parsed, dict) else None
        if key:
            members[str(key)] += 1

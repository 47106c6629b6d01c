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


def collect(lake: Lake, *, table: str = "samples", version: int | None = None) -> ReportData:
    if version is None:
        version = int(lake.table(table).version())
    samples = lake.read(table, version=version)
    data = ReportData(table, version, samples.num_rows)
    if "quality" in samples.column_names and pa.types.is_struct(samples.column("quality").type):
        quality = samples.column("quality").combine_chunks()
        for i, f in enumerate(quality.type):
            values = quality.field(i)
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
                arr = np.asarray(pc.drop_null(values).to_numpy(zero_copy_only=False), dtype=np.float64)
                data.signals[f.name] = arr[np.isfinite(arr)]
            elif f.name == "language":
                data.languages.update(v for v in values.to_pylist() if v)
    if "source_uri" in samples.column_names:
        data.sources.update(uri.rsplit("/", 1)[-1] for uri in samples.column("source_uri").to_pylist() if uri)
    run_ids = pc.unique(samples.column("ingest_run_id")) if "ingest_run_id" in samples.column_names else pa.array([], pa.string())
    if lake.exists("lineage") and len(run_ids):
        dropped = lake.read("lineage", columns=["op", "reason", "ref", "run_id", "action"],
                            filters=(pc.field("action") == "dropped") & pc.field("run_id").isin(run_ids.to_pylist()))
        data.drops.update(zip(dropped.column("op").to_pylist(), dropped.column("reason").to_pylist()))
        data.cluster_sizes = _cluster_sizes(dropped.column("ref").to_pylist())
    from datahub.qa import results_for

    data.qa = results_for(lake, table=table, version=version)
    return data


def _cluster_sizes(refs: list[str | None]) -> list[int]:
    """Duplicate cluster sizes from dedup drop refs ({"cluster_id"} or {"dup_of"}): kept one + dropped."""
    members: Counter[str] = Counter()
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
    return sorted(n + 1 for n in members.values())

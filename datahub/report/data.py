"""Collect what the report shows from the lake: signals, drops, languages, clusters, sources."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted


@dataclass
class SignalHistogram:
    """A numeric quality signal's histogram over all its finite values, as ``numpy.histogram(values, bins)`` of the
    whole column gives it (``bins``: 5 to 40, fewer than 40 when fewer distinct values), built in two streamed
    passes (range, then counts) instead of from the column held in memory."""

    counts: np.ndarray  # int64, one per bin
    edges: np.ndarray  # float32, len(counts) + 1
    mean: float
    values: int  # finite values counted


@dataclass
class ReportData:
    table: str
    version: int
    rows: int
    signals: dict[str, SignalHistogram] = field(default_factory=dict)  # numeric quality fields
    languages: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    drops: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op, reason) -> n
    cluster_sizes: Counter[int] = field(default_factory=Counter)  # cluster size (kept + dropped) -> clusters
    qa: list[Any] = field(default_factory=list)
    quarantine: Counter[str] = field(default_factory=Counter)  # reason -> records, of the runs that wrote the table


BATCH_ROWS = 16_384
_MEMBERS = pa.schema([("cluster", pa.string()), ("members", pa.int64())])
MAX_BINS = 40  # of a signal's histogram (``plots.signal_histograms``); fewer for fewer distinct values, 5 at least
MIN_BINS = 5


class _SignalRange:
    """Pass 1 of a signal's histogram: min, max, sum and count of its finite values, and its distinct values up to
    ``MAX_BINS + 1`` (only how many there are below ``MAX_BINS`` matters)."""

    def __init__(self) -> None:
        self.low = np.float32(np.inf)
        self.high = np.float32(-np.inf)
        self.total = 0.0
        self.count = 0
        self.distinct = np.empty(0, dtype=np.float32)

    def update(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self.low, self.high = min(self.low, values.min()), max(self.high, values.max())
        self.total += float(values.sum(dtype=np.float64))
        self.count += len(values)
        if len(self.distinct) <= MAX_BINS:
            self.distinct = np.union1d(self.distinct, np.unique(values))[: MAX_BINS + 1]

    def bins(self) -> int:
        return min(MAX_BINS, max(MIN_BINS, len(self.distinct)))


def _finite_signals(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """The batch's numeric quality fields as float32, nulls and non-finite values left out."""
    if "quality" not in batch.schema.names or not pa.types.is_struct(batch.schema.field("quality").type):
        return {}
    quality = batch.column("quality")
    out = {}
    for i, f in enumerate(quality.type):
        if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):
            arr = np.asarray(pc.drop_null(quality.field(i)).to_numpy(zero_copy_only=False), dtype=np.float32)
            out[f.name] = arr[np.isfinite(arr)]
    return out


def collect(lake: Lake, *, table: str = "samples", version: int | None = None, batch_rows: int = BATCH_ROWS,
            progress: Progress | None = None) -> ReportData:
    """Stream the columns the report shows (``quality``, ``source_uri``, ``ingest_run_id``; never ``text``),
    ``batch_rows`` at a time. Held: counters of languages, sources, run ids and drop reasons, per numeric signal its
    range in a first pass and its histogram counts in a second (``quality`` read again), and the duplicate clusters'
    member counts in sorted runs spilled to local disk: nothing per row. ``progress("rows", done, total)`` follows
    the first pass (the longest), so a long report is never silent."""
    if version is None:
        version = int(lake.table(table).version())
    dataset = lake.dataset(table, version)
    names = set(dataset.schema.names)
    columns = [c for c in ("quality", "source_uri", "ingest_run_id") if c in names]
    data = ReportData(table, version, 0)
    ranges: dict[str, _SignalRange] = {}
    run_ids: set[str] = set()
    # scan_batches: the dataset scanner reads ahead of its consumer whatever its readahead settings say
    batches = scan_batches(dataset, columns=columns, batch_rows=batch_rows) if columns else iter(())
    total = dataset.count_rows() if progress is not None else None  # from the files' footers
    for batch in counted(batches, progress, "rows", total=total, rows=lambda batch: batch.num_rows):
        data.rows += batch.num_rows
        for name, values in _finite_signals(batch).items():
            ranges.setdefault(name, _SignalRange()).update(values)
        if "quality" in columns and pa.types.is_struct(batch.schema.field("quality").type):
            quality = batch.column("quality")
            for i, f in enumerate(quality.type):
                if f.name == "language" and not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)):
                    counts = pc.value_counts(pc.drop_null(quality.field(i)))
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
    data.signals = _histograms(dataset, ranges, batch_rows)
    if lake.exists("lineage") and run_ids:
        # scan_batches, filtered here: the dataset scanner read ahead of this slower consumer (JSON refs, the
        # cluster sort) whatever its batch_readahead said
        lineage = lake.dataset("lineage")
        runs = pa.array(sorted(run_ids), lineage.schema.field("run_id").type)  # the scan's batches have its schema
        scanned = scan_batches(lineage, columns=["action", "run_id", "op", "reason", "ref"], batch_rows=batch_rows)
        dropped = (batch.filter(pc.and_(pc.equal(batch.column("action"), "dropped"),
                                        pc.is_in(batch.column("run_id"), value_set=runs))) for batch in scanned)
        with SortedRuns(_MEMBERS, "cluster", counts="members", run_rows=max(batch_rows, 1024)) as members:
            for batch in dropped:
                kinds = pa.table([batch.column("op"), batch.column("reason")], names=["op", "reason"])
                for row in kinds.group_by(["op", "reason"], use_threads=False).aggregate([([], "count_all")]).to_pylist():
                    data.drops[(row["op"], row["reason"])] += row["count_all"]
                keys = _cluster_keys(batch.column("ref").to_pylist())
                if keys:
                    members.add(pa.table([pa.array(keys, pa.string()), pa.repeat(pa.scalar(1, pa.int64()), len(keys))],
                                         schema=_MEMBERS))
            for block in members.merged():  # one row per cluster: its dropped members
                sizes = pc.value_counts(pc.add(block.column("members"), 1))
                data.cluster_sizes.update(dict(zip(sizes.field("values").to_pylist(),
                                                   sizes.field("counts").to_pylist())))
    if lake.exists("quarantine") and run_ids:
        reasons = lake.dataset("quarantine").to_batches(columns=["reason"], batch_size=batch_rows, batch_readahead=1,
                                                        filter=pc.field("run_id").isin(sorted(run_ids)))
        for batch in reasons:
            counts = pc.value_counts(batch.column("reason"))
            data.quarantine.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))
    from datahub.qa import results_for

    data.qa = results_for(lake, table=table, version=version)
    return data


def _histograms(dataset: Any, ranges: dict[str, _SignalRange], batch_rows: int) -> dict[str, SignalHistogram]:
    """Pass 2: each signal's counts over the bins its range gives (numpy's edges for the whole column: the same
    ``range`` and bin count give every value the bin it has in one ``numpy.histogram`` call)."""
    shown = {name: r for name, r in ranges.items() if r.count}
    counts = {name: np.zeros(r.bins(), dtype=np.int64) for name, r in shown.items()}
    edges: dict[str, np.ndarray] = {}
    if shown:
        for batch in scan_batches(dataset, columns=["quality"], batch_rows=batch_rows):
            for name, values in _finite_signals(batch).items():
                if name in shown and len(values):
                    # float32 bounds, as numpy takes from the column itself: its edges are then computed in float32
                    bounds: Any = (shown[name].low, shown[name].high)
                    part, edges[name] = np.histogram(values, bins=len(counts[name]), range=bounds)
                    counts[name] += part
    out = {name: SignalHistogram(counts[name], edges[name], float(np.float32(r.total / r.count)), r.count)
           for name, r in shown.items()}
    out.update({name: SignalHistogram(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.float32), float("nan"), 0)
                for name in ranges if name not in shown})
    return out


def _cluster_keys(refs: list[str | None]) -> list[str]:
    """The duplicate cluster each of these refs names (a dropped member of it), where one is named."""
    keys = []
    for ref in refs:
        if not ref:
            continue
        try:
            parsed = json.loads(ref)
        except (TypeError, ValueError):
            continue
        key = parsed.get("cluster_id") or parsed.get("dup_of") if isinstance(parsed, dict) else None
        if key:
            keys.append(str(key))
    return keys

"""Sinks: where rows leave the graph.

The samples sink streams the graph's output once, splitting every batch three ways into
local staging Parquet files: live samples, quarantined records, and lineage events (ingested,
modified, annotated, dropped, quarantined). The runner then commits each staged table to
the lake as one idempotent commit.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datahub.lake.tables import LINEAGE, QUARANTINE
from datahub.operator import DROP_OP, DROP_REASON, DROP_REF, EVENT_PREFIX, QUARANTINED, is_envelope_column
from datahub.pipeline.ingest import INGEST_OP


@dataclass
class SinkCounts:
    records_read: int = 0
    samples_written: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    quarantined: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "records_read": self.records_read,
            "samples_written": self.samples_written,
            "dropped": dict(sorted(self.dropped.items())),
            "dropped_total": sum(self.dropped.values()),
            "quarantined": dict(sorted(self.quarantined.items())),
            "quarantined_total": sum(self.quarantined.values()),
        }


class _Staged:
    """Parquet files under one local staging dir, opened lazily, one schema per table."""

    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, f"{name}.parquet")
        self.writer: pq.ParquetWriter | None = None
        self.schema: pa.Schema | None = None
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        if self.writer is None:
            self.schema = table.schema
            self.writer = pq.ParquetWriter(self.path, table.schema)
        elif table.schema != self.schema:
            table = _conform(table, self.schema)  # type: ignore[arg-type]
        self.writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def reader(self) -> pa.RecordBatchReader | None:
        if self.writer is None:
            return None
        return pq.ParquetFile(self.path).iter_batches(batch_size=65536)  # type: ignore[return-value]

    def table(self) -> pa.Table | None:
        return pq.read_table(self.path) if self.writer is not None else None


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Fit a batch to the first batch's schema (struct fields may appear in later batches)."""
    columns = []
    for f in schema:
        if f.name in table.column_names:
            columns.append(table.column(f.name).cast(f.type, safe=False) if table.schema.field(f.name).type != f.type else table.column(f.name))
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass
class SamplesSink:
    staging_dir: str
    run_id: str
    node_ops: dict[str, tuple[str, str]]  # graph node -> (op name@version, params_hash)
    write_ingested: bool = True
    counts: SinkCounts = field(default_factory=SinkCounts)

    def __post_init__(self) -> None:
        os.makedirs(self.staging_dir, exist_ok=True)
        self.samples = _Staged(self.staging_dir, "samples")
        self.quarantine = _Staged(self.staging_dir, "quarantine")
        self.lineage = _Staged(self.staging_dir, "lineage")
        self.ts = datetime.now(timezone.utc)

    def consume(self, batches: Iterable[pa.Table], progress: object = None) -> None:
        for batch in batches:
            self.write_batch(batch)
            if callable(progress):
                progress(self.counts.records_read)
        for staged in (self.samples, self.quarantine, self.lineage):
            staged.close()

    def write_batch(self, batch: pa.Table) -> None:
        if not batch.num_rows:
            return
        self.counts.records_read += batch.num_rows
        reason = batch.column(DROP_REASON)
        quarantined = pc.fill_null(batch.column(QUARANTINED), False) if QUARANTINED in batch.column_names else pa.array([False] * batch.num_rows)
        alive = pc.is_null(reason)
        dropped = pc.and_(pc.is_valid(reason), pc.invert(quarantined))

        live = batch.filter(alive)
        self.samples.write(live.select([c for c in live.column_names if not is_envelope_column(c)]))
        self.counts.samples_written += live.num_rows

        bad = batch.filter(quarantined)
        if bad.num_rows:
            self.counts.quarantined.update(bad.column(DROP_REASON).to_pylist())
            self.quarantine.write(self._quarantine_rows(bad))
        gone = batch.filter(dropped)
        if gone.num_rows:
            self.counts.dropped.update(gone.column(DROP_REASON).to_pylist())

        events = self._lineage_rows(batch, alive, dropped, quarantined)
        if events.num_rows:
            self.lineage.write(events)

    def _quarantine_rows(self, bad: pa.Table) -> pa.Table:
        n = bad.num_rows
        text_bytes = pc.cast(bad.column("text"), pa.binary())
        raw = pc.coalesce(bad.column("_raw"), pc.binary_slice(text_bytes, 0, 4096))
        details = [None if r is None else json.loads(r).get("detail") for r in bad.column(DROP_REF).to_pylist()]
        return pa.table(
            {
                "source_uri": bad.column("source_uri"),
                "source_offset": bad.column("source_offset"),
                "source_format": bad.column("source_format"),
                "reason": bad.column(DROP_REASON),
                "detail": pa.array(details, pa.string()),
                "raw": raw,
                "raw_size": bad.column("_raw_size"),
                "run_id": pa.array([self.run_id] * n, pa.string()),
                "ts": pa.array([self.ts] * n, pa.timestamp("us", tz="UTC")),
            },
            schema=QUARANTINE,
        )

    def _lineage_rows(self, batch: pa.Table, alive: pa.Array, dropped: pa.Array, quarantined: pa.Array) -> pa.Table:
        parts: list[pa.Table] = []
        has_id = pc.is_valid(batch.column("sample_id"))

        def events(mask: pa.Array, op: pa.Array | str, params_hash: str | None, action: str,
                   reason: pa.Array | None, ref: pa.Array | None) -> None:
            keep = pc.and_(mask, has_id)
            rows = batch.filter(keep)
            if not rows.num_rows:
                return
            n = rows.num_rows

            def pick(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
                return values.filter(keep)

            parts.append(
                pa.table(
                    {
                        "sample_id": rows.column("sample_id"),
                        "run_id": pa.array([self.run_id] * n, pa.string()),
                        "op": pa.array([op] * n, pa.string()) if isinstance(op, str) else pick(op),
                        "params_hash": pa.array([params_hash] * n, pa.string()),
                        "action": pa.array([action] * n, pa.string()),
                        "reason": pa.nulls(n, pa.string()) if reason is None else pick(reason),
                        "ref": pa.nulls(n, pa.string()) if ref is None else pick(ref),
                        "ts": pa.array([self.ts] * n, pa.timestamp("us", tz="UTC")),
                    },
                    schema=LINEAGE,
                )
            )

        everything = pa.array([True] * batch.num_rows)
        if self.write_ingested:
            origin = pc.binary_join_element_wise(
                pa.array(['{"source_uri": '] * batch.num_rows),
                _json_strings(batch.column("source_uri")),
                pa.array([', "source_offset": '] * batch.num_rows),
                pc.cast(batch.column("source_offset"), pa.string()),
                pa.array(["}"] * batch.num_rows),
                "",
            )
            events(everything, INGEST_OP, None, "ingested", None, origin)
        for column in batch.column_names:
            if column.startswith(EVENT_PREFIX):
                node = column[len(EVENT_PREFIX):]
                op, params_hash = self.node_ops[node]
                action = batch.column(column)
                for kind in ("modified", "annotated"):
                    events(pc.fill_null(pc.equal(action, kind), False), op, params_hash, kind, None, None)
        events(dropped, batch.column(DROP_OP), None, "dropped", batch.column(DROP_REASON), batch.column(DROP_REF))
        events(quarantined, batch.column(DROP_OP), None, "quarantined", batch.column(DROP_REASON), None)
        if not parts:
            return LINEAGE.empty_table()
        return pa.concat_tables(parts)


def _json_strings(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.array([json.dumps(v) for v in values.to_pylist()], pa.string())


@dataclass
class StatsSink:
    """Counts per source file and per drop reason on one branch, kept in the run record."""

    by_source: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    rows: int = 0
    chars: int = 0

    def consume(self, batches: Iterable[pa.Table]) -> None:
        for batch in batches:
            self.rows += batch.num_rows
            alive = pc.is_null(batch.column(DROP_REASON))
            live = batch.filter(alive)
            self.by_source.update(live.column("source_uri").to_pylist())
            self.by_reason.update(r for r in batch.column(DROP_REASON).to_pylist() if r is not None)
            if live.num_rows:
                self.chars += int(pc.sum(pc.utf8_length(live.column("text"))).as_py() or 0)

    def as_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "live_chars": self.chars, "live_by_source": dict(sorted(self.by_source.items())),
                "dropped_by_reason": dict(sorted(self.by_reason.items()))}

"""What a samples sink does to each batch of graph output: split it into the rows of ``samples``,
``quarantine`` and ``lineage``, and count them. Plain pyarrow and picklable: the driver runs it on
streamed batches, engine tasks on their partitions (``Engine.write_split``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.lineage_rows import lineage_rows
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

    def add(self, other: SinkCounts) -> None:
        self.records_read += other.records_read
        self.samples_written += other.samples_written
        self.dropped.update(other.dropped)
        self.quarantined.update(other.quarantined)

    def to_json(self) -> str:
        """Lossless JSON (reasons as pairs, so a null reason survives), for counts made on executors."""
        return json.dumps([self.records_read, self.samples_written, list(self.dropped.items()), list(self.quarantined.items())])

    @classmethod
    def from_json(cls, text: str) -> SinkCounts:
        read, written, dropped, quarantined = json.loads(text)
        return cls(read, written, Counter(dict(map(tuple, dropped))), Counter(dict(map(tuple, quarantined))))


@dataclass(frozen=True)
class SplitBatch:
    """One batch of graph output, split: rows for samples, quarantine and lineage, and their counts."""

    samples: pa.Table
    quarantine: pa.Table | None
    lineage: pa.Table
    counts: SinkCounts

    def counts_json(self) -> str:
        return self.counts.to_json()


@dataclass(frozen=True)
class SampleSplitter:
    """What a samples sink does to each batch; plain pyarrow and picklable.

    The driver-side ``SamplesSink`` runs it per streamed batch, Spark executors per batch of
    their partition (``datahub.engines.spark.sink``): one definition of the samples columns,
    the lineage events and the counts for every engine.
    """

    run_id: str
    node_ops: Mapping[str, tuple[str, str]]  # graph node -> (op name@version, params_hash)
    write_ingested: bool = True
    ts: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def split(self, batch: pa.Table) -> SplitBatch:
        counts = SinkCounts(records_read=batch.num_rows)
        if not batch.num_rows:
            return SplitBatch(samples_columns(batch), None, LINEAGE.empty_table(), counts)
        reason = batch.column(DROP_REASON)
        quarantined = pc.fill_null(batch.column(QUARANTINED), False) if QUARANTINED in batch.column_names else pa.array([False] * batch.num_rows)
        alive = pc.is_null(reason)
        dropped = pc.and_(pc.is_valid(reason), pc.invert(quarantined))

        live = samples_columns(batch.filter(alive))
        counts.samples_written = live.num_rows
        bad = batch.filter(quarantined)
        quarantine = None
        if bad.num_rows:
            counts.quarantined.update(bad.column(DROP_REASON).to_pylist())
            quarantine = self._quarantine_rows(bad)
        gone = batch.filter(dropped)
        if gone.num_rows:
            counts.dropped.update(gone.column(DROP_REASON).to_pylist())
        return SplitBatch(live, quarantine, self._lineage_rows(batch, alive, dropped, quarantined), counts)

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
            ids = batch.column("sample_id").filter(keep)
            if not len(ids):
                return

            def pick(values: pa.Array | pa.ChunkedArray | None) -> pa.Array | pa.ChunkedArray | None:
                return None if values is None else values.filter(keep)

            parts.append(lineage_rows(ids, run_id=self.run_id, op=op if isinstance(op, str) else pick(op), action=action,
                                      params_hash=params_hash, reason=pick(reason), ref=pick(ref), ts=self.ts, sort=False))

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


def samples_columns(rows: pa.Table) -> pa.Table:
    """The columns of graph output that reach ``samples``: all but the envelope (``_``-prefixed)."""
    return rows.select([name for name in rows.column_names if not is_envelope_column(name)])


def samples_schema(schema: pa.Schema) -> pa.Schema:
    """``samples_columns`` for a schema."""
    return pa.schema([f for f in schema if not is_envelope_column(f.name)])


def _json_strings(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pa.array([json.dumps(v) for v in values.to_pylist()], pa.string())

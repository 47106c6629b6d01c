"""The samples sink: the graph's output split into samples, quarantine and lineage, written by the
engine's tasks (``Engine.write_split``) or streamed to local staging files on the driver."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from datahub.pipeline.faults import checkpoint
from datahub.pipeline.sinks.split import SampleSplitter, SinkCounts, samples_schema
from datahub.pipeline.sinks.staging import Staged, StagedRows

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.pipeline.context import RunContext

# Rows split and staged at once: the splitter's copies and the Parquet row group being encoded cost a few
# times the slice (whole blocks of 62,500 short documents: ~35 MB more on the driver at its peak).
SINK_SLICE_ROWS = 16384


@dataclass
class SamplesSink:
    """The streaming samples sink: batches reach the driver and go to local staging files."""

    staging_dir: str
    run_id: str
    node_ops: dict[str, tuple[str, str]]  # graph node -> (op name@version, params_hash)
    write_ingested: bool = True
    counts: SinkCounts = field(default_factory=SinkCounts)

    def __post_init__(self) -> None:
        os.makedirs(self.staging_dir, exist_ok=True)
        self.samples = StagedRows(self.staging_dir, "samples")
        self.quarantine = StagedRows(self.staging_dir, "quarantine")
        self.lineage = StagedRows(self.staging_dir, "lineage")
        self.splitter = SampleSplitter(self.run_id, self.node_ops, self.write_ingested)

    def consume(self, batches: Iterable[pa.Table], progress: object = None) -> None:
        for batch in batches:
            self.write_batch(batch)
            if callable(progress):
                progress(self.counts.records_read)
        for staged in (self.samples, self.quarantine, self.lineage):
            staged.close()
        pa.default_memory_pool().release_unused()

    def write_batch(self, batch: pa.Table) -> None:
        for start in range(0, batch.num_rows, SINK_SLICE_ROWS):
            self._write_slice(batch.slice(start, SINK_SLICE_ROWS))

    def _write_slice(self, batch: pa.Table) -> None:
        split = self.splitter.split(batch)
        self.counts.add(split.counts)
        self.samples.write(split.samples)
        if split.quarantine is not None:
            self.quarantine.write(split.quarantine)
        self.lineage.write(split.lineage)


@dataclass
class WrittenSamples:
    """A samples sink whose files the engine's workers wrote into the tables' folders, uncommitted."""

    counts: SinkCounts
    samples: Staged
    quarantine: Staged
    lineage: Staged


def drain_samples(frame: Frame, context: RunContext, staging_dir: str, node_ops: dict[str, tuple[str, str]], *,
                  table: str = "samples", write_ingested: bool = True) -> SamplesSink | WrittenSamples:
    """Run a samples sink over the graph output ``frame``; the runner commits what it staged.

    An engine whose tasks write the tables' files (``Engine.write_split``: Spark's executors) splits
    and writes there; only counts and file names reach the driver. Other engines, and every engine
    under ``--full`` (whose replacement of a job's rows is a delta-rs predicate overwrite of rows on
    the driver), stream the batches to local staging files.
    """
    splitter = SampleSplitter(context.run_id, node_ops, write_ingested)
    if not context.full:
        written = context.engine.write_split(frame, splitter.split, context.lake, run_id=context.run_id, table=table,
                                             samples_schema=samples_schema)
        if written is not None:
            checkpoint("streaming")  # every file written, nothing committed
            counts = SinkCounts()
            for item in written.counts:
                counts.add(SinkCounts.from_json(item))
            context.report("rows", counts.records_read)
            return WrittenSamples(counts, written.samples, written.quarantine, written.lineage)
    sink = SamplesSink(staging_dir, context.run_id, node_ops, write_ingested=write_ingested)

    def progress(done: int) -> None:
        checkpoint("streaming")
        context.report("rows", done)

    with closing(frame.iter_batches()) as batches:  # a failed write stops the engine's reads (Frame.iter_batches)
        sink.consume(batches, progress=progress)
    return sink

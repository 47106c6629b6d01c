"""Side outputs: rows a global operator adds for another lake table (e.g. ``minhash_index``), written
by the engine's tasks through the write seam and committed with the run after the samples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from datahub.engines.sink import TableFilesSink, write_frame
from datahub.lake.add_actions import StagedFiles
from datahub.lake.files import ParquetTarget, file_prefix, file_schema, unify
from datahub.retry import retry_policy, storage_errors

if TYPE_CHECKING:
    from datahub.engines.frame import Frame
    from datahub.pipeline.context import RunContext


def stage_side_output(context: RunContext, table: str, data: Frame | pa.Table) -> StagedFiles | None:
    """Write what a global operator adds to ``table`` (e.g. minhash_index) into the table's folder, uncommitted.

    The engine's workers write the files (one per block or partition), so the rows never
    gather on the driver and their blocks can be freed before the samples are drained; the
    runner commits them after the samples. None when there are no rows; no files (a no-op
    commit) when the run's transaction is already in the table.
    """
    lake, txn = context.lake, context.run_id
    frame = context.engine.from_arrow(data) if isinstance(data, pa.Table) else data

    def attempt() -> StagedFiles | None:  # a storage outage while writing: write again (new file names)
        with storage_errors(f"write {table} files for {txn}"):
            if lake.applied(table, txn):
                return StagedFiles((), pa.schema([]))
            schema = file_schema(lake, table, frame.empty().schema)
            target = ParquetTarget(lake.table_uri(table), schema, tuple(sorted(lake.storage_options.items())), file_prefix(txn))
            return write_frame(frame, TableFilesSink(target))

    return retry_policy(attempt, lake.retry)


def combined(parts: list[StagedFiles]) -> StagedFiles:
    """One commit's worth of files from several stagings of one table."""
    if len(parts) == 1:
        return parts[0]
    schemas = [p.schema for p in parts if p.files] or [parts[0].schema]
    return StagedFiles(tuple(f for p in parts for f in p.files), unify(schemas))

"""What a running job knows about itself; passed explicitly to global operators, which see it through
the narrow ``datahub.operator.OperatorContext`` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from datahub.pipeline.faults import checkpoint
from datahub.pipeline.sinks.side_outputs import stage_side_output
from datahub.progress import Progress as ProgressFn  # the name datahub.pipeline.run imports

if TYPE_CHECKING:
    import pyarrow as pa

    from datahub.config.spec import JobSpec
    from datahub.engines.base import Engine, ReadFn
    from datahub.engines.frame import Frame
    from datahub.lake.add_actions import StagedFiles
    from datahub.lake.lake import Lake


@dataclass
class RunContext:
    run_id: str
    spec: JobSpec
    lake: Lake
    engine: Engine
    full: bool = False
    progress: ProgressFn | None = None
    # Extra tables a global operator wants committed with this run (e.g. minhash_index): their
    # files are written when the operator adds them, committed with the run's id after the samples.
    side_outputs: dict[str, list[StagedFiles]] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)

    @property
    def job_name(self) -> str:
        return self.spec.name

    def from_arrow(self, table: pa.Table) -> Frame:
        return self.engine.from_arrow(table)

    def read_files(self, files: Sequence[Any], read: ReadFn) -> Frame:
        return self.engine.read_files(files, read)

    def checkpoint(self, name: str) -> None:
        checkpoint(name)

    def add_side_output(self, table: str, data: Frame | pa.Table) -> None:
        """Write ``data`` for ``table`` now (uncommitted files), so its blocks can be freed."""
        staged = stage_side_output(self, table, data)
        if staged is not None:
            self.side_outputs.setdefault(table, []).append(staged)

    def report(self, stage: str, done: int, total: int | None = None) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)

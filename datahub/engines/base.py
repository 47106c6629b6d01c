"""The engine interface: start/stop, a Frame from input files or Arrow, nothing more.

Only ``datahub/engines/`` imports ray or pyspark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from datahub.engines.frame import Frame
from datahub.engines.sink import SplitFn, SplitWritten

if TYPE_CHECKING:
    from datahub.lake.lake import Lake

# How a task reads one input: a description the caller defines (the pipeline's ``InputFile``: uri, size, format,
# storage options), picklable, turned into Arrow tables of one common schema. Engines never look inside it.
ReadFn = Callable[[Any], Iterator[pa.Table]]


class Engine(ABC):
    name: str

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def read_files(self, files: Sequence[Any], read: ReadFn) -> Frame:
        """One task per input file description; ``read`` yields Arrow tables of one common schema."""

    @abstractmethod
    def from_arrow(self, table: pa.Table) -> Frame: ...

    def write_split(self, frame: Frame, split: SplitFn, lake: Lake, *, run_id: str, table: str,
                    samples_schema: Callable[[pa.Schema], pa.Schema]) -> SplitWritten | None:
        """Have this engine's tasks split the graph output ``frame`` and write the files of ``table``,
        quarantine and lineage themselves (uncommitted), so only descriptions reach the driver.

        None: this engine does not; the caller streams the rows to the driver and writes them there
        (one writer keeps lineage files in disjoint ``sample_id`` ranges without a distributed sort).
        """
        return None

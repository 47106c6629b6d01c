"""The engine interface: start/stop, a Frame from input files or Arrow, nothing more.

Only ``datahub/engines/`` imports ray or pyspark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from datahub.engines.frame import Frame

if TYPE_CHECKING:
    from operators.ingest.base import InputFile

ReadFn = Callable[["InputFile"], Iterator[pa.Table]]


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
    def read_files(self, files: list[InputFile], read: ReadFn) -> Frame:
        """One task per file; ``read`` yields Arrow tables of one common schema."""

    @abstractmethod
    def from_arrow(self, table: pa.Table) -> Frame: ...

"""The rows an export reads: one frozen table version, live rows only, chosen columns, in bounded batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from datahub.lake.lake import Lake

BATCH_ROWS = 2048
DROP_COLUMN = "_drop_reason"


@dataclass(frozen=True)
class TableSource:
    """Picklable: engine tasks open the same table version and scan their own data files."""

    lake: Lake
    table: str
    version: int

    @property
    def where(self) -> str:
        return f"{self.lake.root}/{self.table}@v{self.version}"

    def dataset(self) -> Any:
        return self.lake.dataset(self.table, self.version)

    def schema(self) -> pa.Schema:
        return pa.schema(self.dataset().schema)

    def files(self) -> list[str]:
        """The version's data files (one engine task each)."""
        return [fragment.path for fragment in self.dataset().get_fragments()]

    def scan(self, columns: list[str] | dict[str, Any], *, files: list[str] | None = None,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """Live rows (``_drop_reason`` null), only ``columns`` (names or expressions), ``batch_rows`` at a time,
        one batch read ahead: memory stays a few batches whatever the table's size."""
        try:
            yield from self._scan(columns, files=files, batch_rows=batch_rows)
        except FileNotFoundError as exc:
            raise LakeError(f"{self.where}: a data file was not found ({exc}); it was deleted (`datahub release "
                            "vacuum`, or by hand) or the storage lost it") from None

    def _scan(self, columns: list[str] | dict[str, Any], *, files: list[str] | None,
              batch_rows: int) -> Iterator[pa.RecordBatch]:
        dataset = self.dataset()
        live = pc.field(DROP_COLUMN).is_null() if DROP_COLUMN in dataset.schema.names else None
        options = {"columns": columns, "filter": live, "batch_size": batch_rows, "batch_readahead": 1}
        if files is None:
            yield from dataset.to_batches(fragment_readahead=1, **options)
            return
        wanted = set(files)
        for fragment in dataset.get_fragments():
            if fragment.path in wanted:
                yield from fragment.to_batches(schema=dataset.schema, **options)

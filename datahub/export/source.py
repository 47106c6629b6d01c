"""The rows an export reads: one frozen table version, live rows only, chosen columns, in bounded batches."""

from __future__ import annotations

import hashlib

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from queue import Empty, Full, Queue
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches

BATCH_ROWS = 2048
T = TypeVar("T")
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

    def journal_key(self, export_key: str) -> str:
        """``export_key`` (table name, version, settings) plus the Delta table's own id: an export resumes only its
        own lake's journal. Two lakes sharing a tier (staging and prod) export releases of the same name, table and
        version: with the bare key one took the other's journalled shards (the other lake's samples) as its own."""
        table_id = str(self.lake.table(self.table).metadata().id)
        return f"{export_key}-{hashlib.sha256(table_id.encode()).hexdigest()[:8]}"

    def schema(self) -> pa.Schema:
        return pa.schema(self.dataset().schema)

    def live_rows(self) -> int | None:
        """The version's live rows from the Delta log's per-file statistics, exact without reading a data file:
        ``numRecords`` summed, or with a ``_drop_reason`` column its null count summed (the rows not dropped); None
        when a file lacks the statistic or has a deletion vector (then only a pass over the rows counts them)."""
        delta_table = self.lake.table(self.table, self.version)
        actions = pa.table(delta_table.get_add_actions(flatten=True))
        if not actions.num_rows:
            return 0
        # a file's numRecords and null counts include the rows its deletion vector deletes (the protocol's reader
        # feature, or an add action's ``deletionVector...`` columns)
        if "deletionVectors" in (delta_table.protocol().reader_features or []) or any("deletion" in name.lower() and actions.column(name).null_count < actions.num_rows
               for name in actions.column_names):
            return None
        drop = f"null_count.{DROP_COLUMN}"
        counted = drop if DROP_COLUMN in self.schema().names else "num_records"
        if counted not in actions.column_names or actions.column(counted).null_count:
            return None
        return int(pc.sum(actions.column(counted)).as_py() or 0)

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
        if isinstance(columns, list):
            yield from read_ahead(self._bounded(dataset, columns, files=files, batch_rows=batch_rows))
            return
        live = pc.field(DROP_COLUMN).is_null() if DROP_COLUMN in dataset.schema.names else None
        options = {"columns": columns, "filter": live, "batch_size": batch_rows, "batch_readahead": 1}
        if files is None:
            yield from dataset.to_batches(fragment_readahead=1, **options)
            return
        wanted = set(files)
        for fragment in dataset.get_fragments():
            if fragment.path in wanted:
                yield from fragment.to_batches(schema=dataset.schema, **options)

    def _bounded(self, dataset: Any, columns: list[str], *, files: list[str] | None,
                 batch_rows: int) -> Iterator[pa.RecordBatch]:
        """Named columns through ``datahub.lake.scan`` (file by file, no read-ahead of its own: the dataset
        scanner queues decoded batches ahead of a slow consumer, so an export's memory grew with the release)."""
        live = DROP_COLUMN in dataset.schema.names and DROP_COLUMN not in columns
        wanted = [*columns, DROP_COLUMN] if live else columns
        for batch in scan_batches(dataset, columns=wanted, batch_rows=batch_rows, files=files):
            if live:
                dropped = batch.column(DROP_COLUMN)
                if dropped.null_count != len(dropped):
                    batch = batch.filter(pc.is_null(dropped))
                batch = batch.select(columns)
            yield batch


def read_ahead(batches: Iterator[T], *, depth: int = 2) -> Iterator[T]:
    """``batches`` produced by a thread at most ``depth`` ahead of the consumer: Parquet decoding releases the GIL,
    so reading overlaps the consumer's work on a second core; memory stays ``depth`` batches."""
    queue: Queue[tuple[bool, Any]] = Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in batches:
                while not stop.is_set():
                    try:
                        queue.put((True, item), timeout=0.1)
                        break
                    except Full:
                        continue
                if stop.is_set():
                    return
            queue.put((False, None))
        except BaseException as exc:  # handed to the consumer
            queue.put((False, exc))

    thread = threading.Thread(target=produce, name="datahub-export-read", daemon=True)
    thread.start()
    try:
        while True:
            more, item = queue.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                queue.get_nowait()
            except Empty:
                pass
            thread.join(timeout=0.05)

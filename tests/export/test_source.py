"""The export's scans: named columns read file by file (bounded) with a small read-ahead thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from datahub.export.source import TableSource, read_ahead
from tests.export.helpers import make_lake


def test_read_ahead_keeps_order_stops_with_the_consumer_and_raises_the_producers_error() -> None:
    produced: list[int] = []

    def numbers() -> Iterator[int]:
        for i in range(100):
            produced.append(i)
            yield i

    assert list(read_ahead(numbers())) == list(range(100))
    produced.clear()
    before = threading.active_count()
    for value in read_ahead(numbers(), depth=2):
        if value == 3:
            break
    assert threading.active_count() == before  # the producer thread is gone
    assert len(produced) <= 3 + 1 + 2 + 1  # at most depth ahead (plus one in hand)

    def failing() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        list(read_ahead(failing()))


def test_named_scan_equals_the_dataset_scan_and_skips_dropped_rows(tmp_path) -> None:
    lake, version = make_lake(tmp_path / "lake", 50)
    source = TableSource(lake, "samples", version)
    columns = [c for c in source.schema().names if not c.startswith("_")]
    named = pa.Table.from_batches(list(source.scan(columns, batch_rows=7)))
    expected = source.dataset().to_table(columns=columns, filter=None if "_drop_reason" not in source.schema().names
                                         else pa.compute.field("_drop_reason").is_null())
    assert named.equals(expected)


def test_named_scan_leaves_out_dropped_rows(tmp_path) -> None:
    from datahub.lake import Lake
    from tests.export.helpers import samples_table

    table = samples_table(40)
    reasons = pa.array([None if i % 3 else "dup" for i in range(40)], pa.string())
    lake = Lake(tmp_path / "lake")
    version = lake.commit("samples", table.append_column("_drop_reason", reasons), txn="seed/1")
    source = TableSource(lake, "samples", version)
    scanned = pa.Table.from_batches(list(source.scan(["sample_id", "text"], batch_rows=4)))
    kept = [i for i in range(40) if i % 3]
    assert scanned.column_names == ["sample_id", "text"]
    assert scanned["sample_id"].to_pylist() == [table["sample_id"][i].as_py() for i in kept]

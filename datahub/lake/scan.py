"""Bounded scans of a table version: file by file, row group by row group, no read-ahead.

``pyarrow.dataset.Dataset.to_batches`` reads ahead of a slow consumer whatever ``batch_readahead`` and
``fragment_readahead`` say (its Acero sink only pauses the scan after about a gigabyte is queued). Measured on the
L lake of ``benchmarks/release_scale.py`` (320,000 texts of ~6 KB, 4,096-row row groups), 2,048-row batches
streamed into a Parquet writer: Arrow held up to 630 MB with the dataset scanner and 46 MB with this one; a fast
consumer (a plain count) does not show it. Post-lake stages whose per-batch work is slower than decoding (hashing,
writing, tar encoding) scan with :func:`scan_batches`.

Rows come in the dataset's order (its files in order, each file's row groups in order), so two scans of one
version agree on row positions, and they agree with ``Dataset.to_batches``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from datahub.lake.files import conform

BATCH_ROWS = 2048
# Column chunks are read through a buffer of this size instead of whole (a 4,096-row chunk of 5 KB texts is ~20 MB)
READ_BUFFER_BYTES = 4 * 2**20


def scan_batches(dataset: Any, *, columns: Sequence[str] | None = None, batch_rows: int = BATCH_ROWS,
                 files: Iterable[str] | None = None, values_in: tuple[str, Sequence[Any]] | None = None,
                 use_threads: bool = True) -> Iterator[pa.RecordBatch]:
    """The rows of ``dataset`` (a ``pyarrow.dataset.FileSystemDataset`` of Parquet files, e.g. ``Lake.dataset``),
    ``columns`` only (default all), ``batch_rows`` at a time, in the dataset's schema (columns a file lacks are
    null; partition columns come from each file's partition values). ``files``: only these data files' rows.
    ``values_in=(column, values)``: only rows whose ``column`` (a stored column) is one of ``values``; row groups
    whose min/max statistics of it exclude every value are not read (a lookup by sample_id in a table ordered by
    it reads one row group per file), and each batch read is filtered at once (batches may be empty).
    ``use_threads=False``: each read decodes its columns in this thread; for reads of a few rows Arrow's thread pool
    costs more than it saves (QA's 64-row reads: 0.11-0.18 s instead of 0.39-0.52 s over 300k short texts)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = pa.schema(dataset.schema)
    names = list(columns) if columns is not None else schema.names
    missing = [c for c in names if c not in schema.names]
    if values_in is not None and values_in[0] not in schema.names:
        missing.append(values_in[0])
    if missing:
        raise KeyError(f"columns {missing} are not in the table (columns: {', '.join(schema.names)})")
    wanted = pa.schema([schema.field(c) for c in names])
    only = set(files) if files is not None else None
    # a null never matches (SQL's IN; pc.is_in's default)
    key, keys = (values_in[0], sorted({v for v in values_in[1] if v is not None})) if values_in else (None, [])
    if values_in is not None and not keys:
        return
    value_sets: dict[pa.DataType, pa.Array] = {}  # ``values`` in the type of the files' column (string or large)
    for fragment in dataset.get_fragments():
        if only is not None and fragment.path not in only:
            continue
        constants = ds.get_partition_keys(fragment.partition_expression) if fragment.partition_expression is not None else {}
        with pq.ParquetFile(fragment.path, filesystem=dataset.filesystem, buffer_size=READ_BUFFER_BYTES,
                            pre_buffer=False) as parquet:
            present = [c for c in names if c in parquet.schema_arrow.names]
            row_groups = None
            file_key = key
            if key is not None and key in constants:  # a partition column: the whole file matches, or none of it
                if constants[key] not in keys:
                    continue
                file_key = None
            if file_key is not None:
                if file_key not in parquet.schema_arrow.names:  # null in this file: no value matches
                    continue
                row_groups = _row_groups_with(parquet.metadata, file_key, keys)
                if not row_groups:
                    continue
            if not present:  # e.g. only partition columns asked for: the row count is in the footer
                if file_key is None:
                    yield from _constant_batches(parquet.metadata.num_rows, wanted, constants, batch_rows)
                    continue
                present = [file_key]  # read to filter by, dropped below
            read = present if file_key is None or file_key in present else [*present, file_key]
            for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=read,
                                              use_threads=use_threads):
                if file_key is not None:
                    column = batch.column(file_key)
                    if column.type not in value_sets:
                        value_sets[column.type] = _value_set(keys, column.type, file_key, fragment.path)
                    batch = batch.filter(pc.is_in(column, value_set=value_sets[column.type]))
                table = pa.Table.from_batches([batch])
                for name, value in constants.items():
                    if name in names and name not in table.column_names:
                        table = table.append_column(name, pa.repeat(pa.scalar(value), table.num_rows))
                for out in conform(table, wanted).combine_chunks().to_batches():
                    yield out


def _value_set(values: list[Any], type_: pa.DataType, column: str, path: str) -> pa.Array:
    try:
        return pa.array(values, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise TypeError(f"{path}: values_in on column {column!r} ({type_}): the values {values[:3]!r} are not of "
                        f"that type ({exc}); pass values of the column's type") from None


def _row_groups_with(metadata: Any, column: str, values: list[Any]) -> list[int]:
    """The row groups of a Parquet file whose min/max statistics of ``column`` may hold one of ``values`` (sorted);
    a row group without such statistics is kept."""
    from bisect import bisect_left

    index = next((i for i in range(metadata.num_columns) if metadata.schema.column(i).path == column), None)
    kept = []
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics if index is not None else None
        if statistics is None or not statistics.has_min_max:
            kept.append(group)
            continue
        try:
            first = bisect_left(values, statistics.min)
            if first < len(values) and values[first] <= statistics.max:
                kept.append(group)
        except TypeError:  # statistics of another type than the values (e.g. bytes): read it
            kept.append(group)
    return kept


def _constant_batches(rows: int, schema: pa.Schema, constants: dict[str, Any], batch_rows: int
                      ) -> Iterator[pa.RecordBatch]:
    for start in range(0, rows, batch_rows):
        n = min(batch_rows, rows - start)
        table = pa.table({f.name: pa.repeat(pa.scalar(constants.get(f.name)), n) for f in schema})
        yield from conform(table, schema).to_batches()

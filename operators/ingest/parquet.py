"""Parquet files: the text column plus every other column as ``meta``; offset = row index."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow.parquet as pq

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader, text_field_problem


@register_reader
class ParquetReader(Reader):
    format = "parquet"
    suffixes = (".parquet", ".pq")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        with self.open(file) as stream:
            parquet = pq.ParquetFile(stream)
            # Without the text column every row is quarantined, one row each, so records_read
            # stays the file's row count (the accounting is exact).
            absent = file.text_field not in parquet.schema_arrow.names
            row = 0
            for batch in parquet.iter_batches(batch_size=self.batch_rows):
                texts = [None] * batch.num_rows if absent else batch.column(file.text_field).to_pylist()
                others = [n for n in batch.schema.names if n != file.text_field]
                meta_columns = {n: batch.column(n).to_pylist() for n in others}
                for i, text in enumerate(texts):
                    meta = {n: values[i] for n, values in meta_columns.items()}
                    if not isinstance(text, str):
                        reason = "missing_text_field" if text is None else "text_not_a_string"
                        detail = text_field_problem(file.text_field, text, absent, others, where="the file's columns")
                        buffer.quarantine(row, reason, f"row {row}: {detail}", json.dumps(meta, default=str).encode())
                    elif len(text.encode("utf-8")) > self.max_record_bytes:
                        raw = text.encode("utf-8")
                        buffer.quarantine(row, "oversize", f"{len(raw)} bytes > max_record_bytes={self.max_record_bytes}", raw)
                    else:
                        buffer.sample(text, row, meta or None)
                    row += 1
                    yield None

"""Parquet files: the text column plus every other column as ``meta``; offset = row index."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow.parquet as pq

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader


@register_reader
class ParquetReader(Reader):
    format = "parquet"
    suffixes = (".parquet", ".pq")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        with self.open(file) as stream:
            parquet = pq.ParquetFile(stream)
            if file.text_field not in parquet.schema_arrow.names:
                buffer.quarantine(-1, "missing_text_field", f"no column {file.text_field!r}; columns: {parquet.schema_arrow.names}", None)
                yield None
                return
            row = 0
            for batch in parquet.iter_batches(batch_size=self.batch_rows):
                texts = batch.column(file.text_field).to_pylist()
                others = [n for n in batch.schema.names if n != file.text_field]
                meta_columns = {n: batch.column(n).to_pylist() for n in others}
                for i, text in enumerate(texts):
                    meta = {n: values[i] for n, values in meta_columns.items()}
                    if not isinstance(text, str):
                        reason = "missing_text_field" if text is None else "text_not_a_string"
                        buffer.quarantine(row, reason, f"row {row}: {file.text_field!r} is {type(text).__name__}",
                                          json.dumps(meta, default=str).encode())
                    elif len(text.encode("utf-8")) > self.max_record_bytes:
                        raw = text.encode("utf-8")
                        buffer.quarantine(row, "oversize", f"{len(raw)} bytes > max_record_bytes={self.max_record_bytes}", raw)
                    else:
                        buffer.sample(text, row, meta or None)
                    row += 1
                    yield None

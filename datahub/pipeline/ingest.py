"""The ingest stage: read one file and turn its records into graph rows.

Every record read becomes exactly one row: a live sample (with ``sample_id`` and origin
columns) or a quarantined row (``_quarantined`` true, reason in ``_drop_reason``). A storage
failure while reading is retried with backoff: the file is read again from the start and the
batches already handed on are skipped, so no row is lost or produced twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from datahub.kinds import DEFAULT_KIND, KIND_COLUMN, kind_spec, row_fields
from datahub.lake.tables import SAMPLES
from datahub.operator import DROP_OP, DROP_REASON, DROP_REF, QUARANTINED
from datahub.retry import DEFAULT_POLICY, RetryPolicy, retry_stream
from datahub.sample_id import sample_ids
from operators.ingest.base import InputFile, ReadBatch, reader_for

INGEST_OP = "ingest@1"

_ENVELOPE = [
    (DROP_REASON, pa.string()),
    (DROP_OP, pa.string()),
    (DROP_REF, pa.string()),
    (QUARANTINED, pa.bool_()),
    ("_raw", pa.binary()),
    ("_raw_size", pa.int64()),
]
# A graph row of a text-only job: the samples columns plus the envelope that travels through operators.
ROW = pa.schema(list(SAMPLES) + _ENVELOPE)


def row_schema(kinds: Sequence[str] = (DEFAULT_KIND,)) -> pa.Schema:
    """The graph row of a job whose inputs hold ``kinds``: ``ROW`` plus ``kind`` and each kind's columns."""
    extra = row_fields(kinds)
    return pa.schema(list(SAMPLES) + extra + _ENVELOPE) if extra else ROW


class IngestFiles:
    """Picklable read function handed to the engine: one input file -> graph rows."""

    def __init__(self, *, run_id: str, max_record_bytes: int, min_text_chars: int, batch_rows: int,
                 retry: RetryPolicy = DEFAULT_POLICY, kinds: Sequence[str] = (DEFAULT_KIND,)) -> None:
        self.kinds = tuple(kinds)
        self.schema = row_schema(self.kinds)
        self.run_id = run_id
        self.max_record_bytes = max_record_bytes
        self.min_text_chars = min_text_chars
        self.batch_rows = batch_rows
        self.retry = retry

    def __call__(self, file: InputFile) -> Iterator[pa.Table]:
        import operators.ingest  # noqa: F401  (registers the readers in this worker)

        if file.kind not in self.kinds:
            raise ValueError(f"{file.uri}: input of kind {file.kind!r} in a job declared for {self.kinds}")
        reader = reader_for(file.format, file.kind)(max_record_bytes=self.max_record_bytes, batch_rows=self.batch_rows)
        tries = 0

        def read_from_start() -> Iterator[ReadBatch]:
            nonlocal tries
            tries += 1
            if tries > 1:  # skipping batches by count is only right for the same bytes
                from operators.ingest.stream import ensure_unchanged

                ensure_unchanged(file.uri, dict(file.storage_options), size=file.size, etag=file.etag, mtime=file.mtime)
            return reader.read(file)

        for batch in retry_stream(read_from_start, self.retry, where=f"read {file.uri}"):
            table = self._rows(batch.samples, batch.quarantine, file.kind)
            if table.num_rows:
                yield table

    def _rows(self, samples: pa.Table, bad: pa.Table, kind: str = DEFAULT_KIND) -> pa.Table:
        n = samples.num_rows
        texts = samples.column("text")
        extra = {field.name: (samples.column(field.name) if field.name in samples.column_names
                              else pa.nulls(n, field.type)) for field in self.schema if field.name not in ROW.names}
        if KIND_COLUMN in extra:
            extra[KIND_COLUMN] = pa.array([kind] * n, pa.string())
        # Too short after stripping whitespace: an empty document, quarantined with its origin.
        length = pc.utf8_length(pc.utf8_trim_whitespace(texts))
        empty = pc.fill_null(pc.less(length, self.min_text_chars), True)
        good = pa.table(
            {
                "sample_id": sample_ids(texts) if kind == DEFAULT_KIND else kind_spec(kind).sample_ids(samples),
                "text": texts,
                "source_uri": samples.column("source_uri"),
                "source_offset": samples.column("source_offset"),
                "source_format": samples.column("source_format"),
                "ingest_run_id": pa.array([self.run_id] * n, pa.string()),
                "meta": samples.column("meta"),
                **extra,
                DROP_REASON: pc.if_else(empty, pa.scalar("empty_document"), pa.scalar(None, pa.string())),
                DROP_OP: pc.if_else(empty, pa.scalar(INGEST_OP), pa.scalar(None, pa.string())),
                DROP_REF: pa.nulls(n, pa.string()),
                QUARANTINED: empty,
                "_raw": pa.nulls(n, pa.binary()),
                "_raw_size": pc.if_else(empty, pc.binary_length(pc.cast(texts, pa.binary())), pa.scalar(None, pa.int64())),
            },
            schema=self.schema,
        )
        m = bad.num_rows
        if not m:
            return good
        detail = [json.dumps({"detail": d}) for d in bad.column("detail").to_pylist()]
        quarantined = pa.table(
            {
                "sample_id": pa.nulls(m, pa.string()),
                "text": pa.nulls(m, pa.string()),
                "source_uri": bad.column("source_uri"),
                "source_offset": bad.column("source_offset"),
                "source_format": bad.column("source_format"),
                "ingest_run_id": pa.array([self.run_id] * m, pa.string()),
                "meta": pa.nulls(m, pa.string()),
                **{name: pa.nulls(m, self.schema.field(name).type) for name in extra},
                DROP_REASON: bad.column("reason"),
                DROP_OP: pa.array([INGEST_OP] * m, pa.string()),
                DROP_REF: pa.array(detail, pa.string()),
                QUARANTINED: pa.array([True] * m),
                "_raw": bad.column("raw"),
                "_raw_size": bad.column("raw_size"),
            },
            schema=self.schema,
        )
        return pa.concat_tables([good, quarantined])

"""Readers turn one input file into Arrow batches of raw samples plus quarantined records.

A reader never raises on bad data: a record that cannot be read becomes a quarantine row
with its reason and origin (file + offset), so nothing is lost silently. A storage failure is
not bad data: it raises ``StorageError`` (see ``operators.ingest.stream``) and the caller
retries the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, cast

import pyarrow as pa

from datahub.errors import OperatorError, TransientError
from datahub.kinds import DEFAULT_KIND, KIND_COLUMN, kind_spec
from operators.ingest.stream import StorageStream

RAW_SAMPLE = pa.schema(
    [
        ("text", pa.string()),
        ("source_uri", pa.string()),
        ("source_offset", pa.int64()),
        ("source_format", pa.string()),
        ("meta", pa.string()),
    ]
)
RAW_QUARANTINE = pa.schema(
    [
        ("source_uri", pa.string()),
        ("source_offset", pa.int64()),
        ("source_format", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("raw", pa.binary()),
        ("raw_size", pa.int64()),
    ]
)
RAW_PREVIEW_BYTES = 4096  # enough of a bad record to see what is wrong with it


@dataclass(frozen=True)
class InputFile:
    uri: str
    size: int
    etag: str
    mtime: str
    format: str
    text_field: str = "text"
    storage_options: tuple[tuple[str, str], ...] = ()
    kind: str = DEFAULT_KIND  # the sample kind the job spec says this input holds (datahub.kinds)


@dataclass
class ReadBatch:
    samples: pa.Table
    quarantine: pa.Table


def raw_sample_schema(kind: str) -> pa.Schema:
    """What a reader of ``kind`` produces: ``RAW_SAMPLE``, plus ``kind`` and the kind's own and id columns."""
    if kind == DEFAULT_KIND:
        return RAW_SAMPLE
    spec = kind_spec(kind)  # id_fields: for the sample id only (datahub.kinds.base.KindSpec), never stored
    return pa.schema(list(RAW_SAMPLE) + [pa.field(KIND_COLUMN, pa.string())] + list(spec.fields) + list(spec.id_fields))


@dataclass
class _Buffer:
    uri: str
    fmt: str
    max_rows: int
    kind: str = DEFAULT_KIND
    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)

    def sample(self, text: str, offset: int, meta: dict[str, Any] | None, *,
               fields: dict[str, Any] | None = None) -> None:
        """One good record: its text (what text operators see), origin, extra meta and the kind's own ``fields``."""
        row = {"text": text, "source_uri": self.uri, "source_offset": offset, "source_format": self.fmt,
               "meta": json.dumps(meta, ensure_ascii=False, sort_keys=True, default=str) if meta else None}
        if self.kind != DEFAULT_KIND:
            row[KIND_COLUMN] = self.kind
            if fields:
                row.update(fields)
        elif fields:
            raise OperatorError(f"{self.uri}: a text reader gave kind fields {sorted(fields)}; set the input's `kind:`")
        self.rows.append(row)

    def quarantine(self, offset: int, reason: str, detail: str, raw: bytes | None) -> None:
        self.bad.append(
            {"source_uri": self.uri, "source_offset": offset, "source_format": self.fmt, "reason": reason,
             "detail": detail[:1000], "raw": None if raw is None else bytes(raw[:RAW_PREVIEW_BYTES]),
             "raw_size": None if raw is None else len(raw)}
        )

    @property
    def full(self) -> bool:
        return len(self.rows) + len(self.bad) >= self.max_rows

    def flush(self) -> ReadBatch:
        batch = ReadBatch(pa.Table.from_pylist(self.rows, raw_sample_schema(self.kind)),
                          pa.Table.from_pylist(self.bad, RAW_QUARANTINE))
        self.rows, self.bad = [], []
        return batch


class Reader:
    """Base of the readers; subclasses implement :meth:`records`, filling the buffer.

    A reader is registered for one ``format`` and the sample ``kinds`` it can read from that format
    (e.g. JSONL holds text documents, or chats with ``kind: chat``).
    """

    format: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]] = (DEFAULT_KIND,)
    suffixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, max_record_bytes: int, batch_rows: int = 2048) -> None:
        self.max_record_bytes = max_record_bytes
        self.batch_rows = batch_rows

    def read(self, file: InputFile) -> Iterator[ReadBatch]:
        """Batches of samples and quarantine rows; raises ``TransientError`` when storage fails.

        The batches are a pure function of the file's bytes, so a caller that retries after a
        storage failure can skip the batches it already has.
        """
        buffer = _Buffer(file.uri, self.format, self.batch_rows, file.kind)
        try:
            for _ in self.records(file, buffer):
                if buffer.full:
                    yield buffer.flush()
        except TransientError:
            raise  # storage, not data: the caller retries the file
        except Exception as exc:  # an unreadable file is one quarantined record, never a crash
            buffer.quarantine(-1, "unreadable_file", f"{type(exc).__name__}: {exc}", None)
        yield buffer.flush()

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:  # pragma: no cover
        """Read ``file``, calling buffer.sample / buffer.quarantine; yield after each record."""
        raise NotImplementedError

    def open(self, file: InputFile) -> IO[bytes]:
        """The file as a seekable binary stream whose transient storage failures raise ``StorageError``."""
        return cast(IO[bytes], StorageStream.open(file.uri, dict(file.storage_options)))

    def decode(self, raw: bytes, offset: int, buffer: _Buffer) -> str | None:
        """UTF-8 decode with size check; bad records go to quarantine and give None."""
        if len(raw) > self.max_record_bytes:
            buffer.quarantine(offset, "oversize", f"{len(raw)} bytes > max_record_bytes={self.max_record_bytes}", raw)
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            buffer.quarantine(offset, "invalid_utf8", str(exc), raw)
            return None


def text_field_problem(field: str, value: Any, absent: bool, fields: list[str], *, where: str = "the record") -> str:
    """Why a record has no usable text: the field is absent, null, or not a string (each needs another fix)."""
    if absent:
        return (f"no field {field!r} in {where} (its fields: {', '.join(map(repr, fields)) or 'none'}); "
                "if the text is under another name, set `text_field:` on the input")
    if value is None:
        return f"field {field!r} is null"
    return f"field {field!r} is a {type(value).__name__}, not a string"


_READERS: dict[tuple[str, str], type[Reader]] = {}  # (format, kind) -> reader


def register_reader(cls: type[Reader]) -> type[Reader]:
    """Class decorator: ``cls`` reads ``cls.format`` files holding samples of each of ``cls.kinds``."""
    for kind in cls.kinds:
        kind_spec(kind)  # an unknown or unimplemented kind is refused here
        existing = _READERS.get((cls.format, kind))
        if existing is not None and existing is not cls:
            raise OperatorError(f"reader for format {cls.format!r}, kind {kind!r} registered twice "
                                f"({existing.__qualname__}, {cls.__qualname__})")
        _READERS[(cls.format, kind)] = cls
    return cls


def reader_for(fmt: str, kind: str = DEFAULT_KIND) -> type[Reader]:
    try:
        return _READERS[(fmt, kind)]
    except KeyError:
        formats = sorted({f for f, _ in _READERS})
        if fmt not in formats:
            raise OperatorError(f"no reader for format {fmt!r}; known: {', '.join(formats)}") from None
        kinds = sorted(k for f, k in _READERS if f == fmt)
        raise OperatorError(f"format {fmt!r} has no reader for sample kind {kind!r} (it reads: {', '.join(kinds)}); "
                            "set the input's `kind:` to one of those, or convert the file") from None


def detect_format(uri: str) -> str:
    name = uri.lower()
    for (fmt, _kind), cls in sorted(_READERS.items()):
        if any(name.endswith(s) for s in cls.suffixes):
            return fmt
    raise OperatorError(
        f"{uri}: cannot tell the input format from the file name; set `format:` on the input "
        f"(one of {', '.join(sorted({f for f, _ in _READERS}))})"
    )

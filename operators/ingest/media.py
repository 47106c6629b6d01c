"""Image-text readers (kind ``image_text``): Parquet with image bytes or paths, JSONL with image paths.

Every reader hands one record to :func:`add_image_record`, which checks the image (``operators.media.checks``:
format, size, decompression bombs, a full decode) and either fills the kind's columns (``datahub.kinds.media``)
or quarantines the record with the reason, so every record read is accounted for.

Where the image is:

- Parquet: a binary column (``image``, ``jpg``, ``png``, ``webp``, ``image_bytes``), or a struct with ``bytes``
  and ``path`` (Hugging Face ``datasets.Image``); else a path/URI column;
- JSONL and Parquet: a string field ``image_path``, ``image_uri``, ``image_url``, ``path`` or ``url``: an absolute
  path, an ``s3://``/``hdfs://`` URI, a web URL (``http(s)://``, ``operators.ingest.web``: one streamed GET,
  failures quarantined per record as ``image_not_found`` (404/410), ``image_fetch_failed`` or ``oversize``), or a
  path relative to the input file's folder (its base location).

The caption is the input's ``text_field`` (``caption`` for LAION-style files). The other fields go to ``meta``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq

from datahub.kinds.media import (IMAGE, IMAGE_BYTE_SIZE, IMAGE_FORMAT, IMAGE_HEIGHT, IMAGE_SHA256, IMAGE_URI,
                                 IMAGE_WIDTH)
from operators.ingest.base import RAW_PREVIEW_BYTES, InputFile, Reader, _Buffer, register_reader, text_field_problem
from operators.ingest.jsonl import json_objects
from operators.ingest.stream import StorageStream
from operators.ingest.web import WebImage, fetch_web_image, is_web
from operators.media.checks import MediaProblem, inspect_image

BYTES_COLUMNS = ("image", "jpg", "png", "webp", "image_bytes")
PATH_FIELDS = ("image_path", "image_uri", "image_url", "path", "url")


def add_image_record(buffer: _Buffer, *, offset: int, caption: Any, image: bytes | None, image_uri: str | None,
                     meta: dict[str, Any] | None, max_record_bytes: int, caption_field: str = "text",
                     record: bytes | None = None, fields: list[str] | None = None) -> None:
    """Check one image-text record and add it to ``buffer`` as a sample or a quarantine row.

    ``record`` (the raw record, e.g. its JSON line) is what a record-level problem (no caption, no image) keeps in
    quarantine, and ``fields`` the record's field names its detail lists; a media problem keeps the image bytes.
    """
    if not isinstance(caption, str):
        reason = "missing_caption" if caption is None else "caption_not_a_string"
        detail = text_field_problem(caption_field, caption, caption is None, sorted(meta or {}) if fields is None else fields)
        if record is None and meta:
            record = json.dumps(meta, default=str).encode()
        buffer.quarantine(offset, reason, detail, record)
        return
    if image is None:
        buffer.quarantine(offset, "missing_image", f"record {offset}: no image bytes and no image path "
                          f"(looked for columns {', '.join(BYTES_COLUMNS)} and fields {', '.join(PATH_FIELDS)})",
                          caption.encode("utf-8") if record is None else record)
        return
    if len(image) > max_record_bytes:
        buffer.quarantine(offset, "oversize", f"image of {len(image)} bytes > max_record_bytes={max_record_bytes}",
                          image[:RAW_PREVIEW_BYTES])
        return
    try:
        info = inspect_image(image)
    except MediaProblem as problem:
        where = f" ({image_uri})" if image_uri else ""
        buffer.quarantine(offset, problem.reason, f"record {offset}{where}: {problem.detail}", image)
        return
    buffer.sample(caption, offset, meta or None, fields={
        IMAGE: image, IMAGE_URI: image_uri, IMAGE_FORMAT: info.format, IMAGE_WIDTH: info.width,
        IMAGE_HEIGHT: info.height, IMAGE_BYTE_SIZE: info.byte_size, IMAGE_SHA256: info.sha256,
    })


def resolve(reference: str, base_uri: str) -> str:
    """An image reference as a URI: absolute paths and URIs as they are, relative ones under the input's folder."""
    if "://" in reference or reference.startswith("/"):
        return reference
    return posixpath.join(posixpath.dirname(base_uri), reference)


def fetch(uri: str, file: InputFile, *, max_bytes: int) -> WebImage:
    """The referenced image's bytes, or the quarantine reason and detail if it is not there.

    A missing file is bad data (``image_not_found``); a storage failure raises ``StorageError`` and the input is
    retried. A web image (http/https) is fetched by :func:`operators.ingest.web.fetch_web_image`: whatever goes
    wrong with it quarantines that record only (a web server is not the job's storage).
    """
    if is_web(uri):
        return fetch_web_image(uri, max_bytes=max_bytes)
    try:
        with StorageStream.open(uri, dict(file.storage_options)) as stream:
            return WebImage(stream.read())
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        return WebImage(None, "image_not_found", f"{type(exc).__name__}: {exc}")


IMAGE_BATCH_ROWS = 64  # records per batch: images are up to max_record_bytes each, so batches stay bounded


class _ImageRecords:
    """Turns one record's fields into the checked sample or quarantine row; batches of at most
    ``IMAGE_BATCH_ROWS`` records (64 web images are a few MB, not the 2,048 rows of a text batch)."""

    max_record_bytes: int
    batch_rows: int

    def __init__(self, *, max_record_bytes: int, batch_rows: int = 2048) -> None:
        self.max_record_bytes = max_record_bytes
        self.batch_rows = max(1, min(batch_rows, IMAGE_BATCH_ROWS))

    def add(self, file: InputFile, buffer: _Buffer, offset: int, record: dict[str, Any], *,
            raw: bytes | None = None) -> None:
        """Check one record (its fields; ``raw``: the record as read, kept if it is quarantined)."""
        fields = list(record)
        caption = record.pop(file.text_field, None)
        image: bytes | None = None
        uri: str | None = None
        reference: str | None = None
        for name in BYTES_COLUMNS:
            value = record.get(name)
            if isinstance(value, dict):  # datasets.Image: {"bytes": ..., "path": ...}; bytes null when not embedded
                record.pop(name)
                image, path = value.get("bytes"), value.get("path")
                if isinstance(path, str) and path:
                    uri = resolve(path, file.uri)
                    reference = path if image is None else None
                break
            if isinstance(value, (bytes, bytearray)):
                image = bytes(record.pop(name))
                break
        if image is None and reference is None:
            for name in PATH_FIELDS:
                value = record.get(name)
                if isinstance(value, str) and value:
                    record.pop(name)
                    reference, uri = value, resolve(value, file.uri)
                    break
        if image is None and reference is not None and uri is not None:
            fetched = fetch(uri, file, max_bytes=self.max_record_bytes)
            if fetched.data is None:
                buffer.quarantine(offset, fetched.reason or "image_not_found",
                                  f"record {offset}: {uri}: {fetched.detail}",
                                  raw if raw is not None else json.dumps({"path": reference}).encode())
                return
            image = fetched.data
        add_image_record(buffer, offset=offset, caption=caption, image=image, image_uri=uri, meta=record,
                         max_record_bytes=self.max_record_bytes, caption_field=file.text_field, record=raw,
                         fields=fields)


@register_reader
class ImageParquetReader(_ImageRecords, Reader):
    """Parquet rows of (caption, image bytes or path); ``source_offset`` = row index."""

    format = "parquet"
    kinds = ("image_text",)
    suffixes = (".parquet", ".pq")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        with self.open(file) as stream:
            parquet = pq.ParquetFile(stream)
            row = 0
            for batch in parquet.iter_batches(batch_size=self.batch_rows):
                for record in batch.to_pylist():
                    self.add(file, buffer, row, record)
                    row += 1
                    yield None


@register_reader
class ImageJsonlReader(_ImageRecords, Reader):
    """JSON Lines (plain, .gz, .zst) of (caption, image path or URI); ``source_offset`` = 1-based line number."""

    format = "jsonl"
    kinds = ("image_text",)
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson", ".jsonl.zstd")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        for item in json_objects(self, file, buffer):
            if item is not None:
                line_no, record, line = item
                self.add(file, buffer, line_no, record, raw=line)
            yield None

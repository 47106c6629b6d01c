"""Readers: JSONL, Parquet, text and WARC, from any fsspec path."""

from operators.ingest import chat, jsonl, media, parquet, preference, text, trajectory, warc, webdataset  # noqa: F401  (registration)
from operators.ingest.base import InputFile, ReadBatch, Reader, detect_format, reader_for

__all__ = ["InputFile", "ReadBatch", "Reader", "detect_format", "reader_for"]

"""Transparent decompression by file suffix (.gz, .zst), streaming."""

from __future__ import annotations

import gzip
import io
from typing import IO


def decompress(stream: IO[bytes], uri: str) -> IO[bytes]:
    name = uri.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
    if name.endswith(".zst") or name.endswith(".zstd"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True))  # type: ignore[arg-type]
    if isinstance(stream, io.BufferedReader):
        return stream
    # fsspec remote files (s3fs, webhdfs) have no readline(size): buffer them like local files
    return io.BufferedReader(stream, buffer_size=1 << 20)  # type: ignore[arg-type]


def strip_compression_suffix(uri: str) -> str:
    for suffix in (".gz", ".zst", ".zstd"):
        if uri.lower().endswith(suffix):
            return uri[: -len(suffix)]
    return uri

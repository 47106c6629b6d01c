"""Plain text files (.txt, optionally .gz/.zst): one document per file, ``source_offset`` 0."""

from __future__ import annotations

from collections.abc import Iterator

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader
from operators.ingest.compression import InvalidStreamError, decompress


@register_reader
class TextReader(Reader):
    format = "text"
    suffixes = (".txt", ".txt.gz", ".txt.zst", ".md")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        with self.open(file) as raw_stream:
            stream = decompress(raw_stream, file.uri)
            try:
                raw = stream.read(self.max_record_bytes + 1)
            except InvalidStreamError as exc:  # a 0-byte .gz / .zst
                buffer.quarantine(0, "invalid_stream", str(exc), None)
                yield None
                return
            except (EOFError, OSError) as exc:
                buffer.quarantine(0, "truncated_file", f"{type(exc).__name__}: {exc}", None)
                yield None
                return
        text = self.decode(raw, 0, buffer)
        if text is not None:
            buffer.sample(text, 0, None)
        yield None

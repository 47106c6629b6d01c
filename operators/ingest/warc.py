"""WARC files (.warc, .warc.gz, .warc.zst): HTTP response records, HTML turned into main text.

Records are parsed with FastWARC (fast, handles gzip members); HTML main-text extraction
uses trafilatura (Barbaresi 2021), which drops navigation and boilerplate.
``source_offset`` is the record's byte offset in the (compressed) file.

Record types (WARC 1.1, section 6): ``response`` records are documents. ``warcinfo``,
``request`` and ``metadata`` records describe a capture and are skipped. ``revisit``,
``resource``, ``conversion`` and ``continuation`` records are quarantined as
``unsupported_record_type``: they hold or point to content this reader does not turn into text.

FastWARC stops quietly at a cut-off file and hands out a cut-off last record as if it were
whole, so the reader holds each record back until the next one starts, and after the last
one walks the rest of the file (gzip members, zstd frames, or WARC headers and declared
Content-Lengths when uncompressed): a record cut off is quarantined as ``truncated_record``,
records lost after the last readable one as ``truncated_file`` at the offset where they start.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader
from operators.ingest.compression import Cut, codec_of, empty_stream, find_cut

HTML_TYPES = ("text/html", "application/xhtml+xml")
SKIPPED_TYPES = ("warcinfo", "request", "metadata")
MAX_HEADER_BYTES = 1 << 16  # a WARC header block larger than this is not a header
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*\r\n", re.IGNORECASE)


@dataclass
class _Record:
    """What the reader keeps of a record while it waits to know that the record is whole."""

    offset: int
    record_type: str
    payload: bytes
    declared: int  # payload bytes the record declares (HTTP headers already parsed off)
    content_type: str
    charset: str | None
    meta: dict[str, Any]


@register_reader
class WarcReader(Reader):
    format = "warc"
    suffixes = (".warc", ".warc.gz", ".warc.zst", ".arc.gz")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        from fastwarc.warc import ArchiveIterator

        with self.open(file) as stream:
            held: _Record | None = None
            last_offset = 0
            failure: Exception | None = None
            try:
                for record in ArchiveIterator(stream, parse_http=True):
                    if held is not None:  # a next record starts: the one held back is whole
                        self._emit(held, buffer)
                        yield None
                        held = None
                    last_offset = int(record.stream_pos)
                    record_type = str(record.record_type)
                    if record_type in SKIPPED_TYPES:
                        continue
                    held = self._keep(record, record_type)
            except (EOFError, OSError, ValueError) as exc:  # FastWARC on a corrupt or cut-off zstd stream
                failure = exc
            if held is None and last_offset == 0 and codec_of(file.uri) != "none" and stream.seek(0, 2) == 0:
                buffer.quarantine(0, "invalid_stream", str(empty_stream(file.uri, codec_of(file.uri))), None)
                yield None
                return
            cut = self._find_cut(stream, file.uri, last_offset)
            self._finish(held, cut, failure, last_offset, buffer)
            yield None

    def _finish(self, held: _Record | None, cut: Cut | None, failure: Exception | None, last_offset: int,
                buffer: _Buffer) -> None:
        """The record held back last, and what lies after it, once the rest of the file has been walked."""
        if held is not None:
            if cut is not None and cut.offset == held.offset:  # the last record is the cut-off one
                buffer.quarantine(held.offset, "truncated_record", cut.detail, held.payload)
                return
            short = len(held.payload) < held.declared and len(held.payload) <= self.max_record_bytes
            self._emit(held, buffer)  # a short payload is quarantined there as truncated_record
            if short and cut is not None and cut.offset < held.offset:
                return  # the same cut, seen from the start of a gzip member that holds several records
        if cut is not None:
            buffer.quarantine(cut.offset, cut.reason, f"{cut.detail}; records from this offset on are lost", None)
        elif failure is not None:
            buffer.quarantine(last_offset, "truncated_file", f"{type(failure).__name__}: {failure}", None)

    def _keep(self, record: Any, record_type: str) -> _Record:
        return _Record(
            offset=int(record.stream_pos),
            record_type=record_type,
            payload=record.reader.read(self.max_record_bytes + 1),
            declared=int(record.content_length),
            content_type=(record.http_content_type or "").lower(),
            charset=record.http_charset,
            meta={
                "url": record.headers.get("WARC-Target-URI"),
                "warc_record_id": record.record_id,
                "warc_date": record.headers.get("WARC-Date"),
                "content_type": record.http_content_type,
            },
        )

    def _emit(self, held: _Record, buffer: _Buffer) -> None:
        """Turn one whole record into a sample or a quarantine row."""
        import trafilatura

        offset, payload = held.offset, held.payload
        if held.record_type != "response":
            buffer.quarantine(offset, "unsupported_record_type",
                              f"WARC-Type {held.record_type} of {held.meta['url']}: only response records are read", payload[:256])
        elif len(payload) > self.max_record_bytes:
            buffer.quarantine(offset, "oversize", f"payload > max_record_bytes={self.max_record_bytes}", payload)
        elif len(payload) < held.declared:
            buffer.quarantine(offset, "truncated_record", f"payload of {len(payload)} bytes, the record declares {held.declared}", payload)
        elif held.content_type.startswith("text/plain"):
            text = self.decode(payload, offset, buffer)
            if text is not None:
                buffer.sample(text, offset, held.meta)
        elif held.content_type.startswith(HTML_TYPES) or not held.content_type:
            html = payload.decode(held.charset or "utf-8", errors="replace")
            text = trafilatura.extract(html, include_comments=False, include_tables=True, deduplicate=False)
            if text is None:
                buffer.quarantine(offset, "no_text_extracted", f"no main text in HTML of {held.meta['url']}", payload)
            else:
                buffer.sample(text, offset, held.meta)
        else:
            buffer.quarantine(offset, "unsupported_content_type", held.content_type, payload[:256])

    def _find_cut(self, stream: IO[bytes], uri: str, start: int) -> Cut | None:
        """The first cut-off or corrupt piece of the file from the last record's offset on."""
        codec = codec_of(uri)
        if codec == "none":
            return _warc_cut(stream, start)
        stream.seek(start)
        magic = stream.read(4)
        if codec == "gzip" and start and not magic.startswith(b"\x1f\x8b"):
            start = 0  # one gzip member for the whole file: FastWARC's offsets are not member starts
        return find_cut(stream, start, codec)


def _warc_cut(stream: IO[bytes], start: int) -> Cut | None:
    """Walk uncompressed WARC records from ``start``: each needs its whole header block and the
    Content-Length bytes it declares before the end of the file."""
    size = stream.seek(0, 2)
    offset = start
    while offset < size:
        stream.seek(offset)
        head = stream.read(min(MAX_HEADER_BYTES, size - offset))
        gap = len(head) - len(head.lstrip(b"\r\n"))  # the CRLF CRLF that closes the previous record
        if gap == len(head):
            return None
        offset, head = offset + gap, head[gap:]
        if not head.startswith(b"WARC/"):
            return Cut(offset, "corrupt_file", f"no WARC record starts at byte {offset}")
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) + gap == MAX_HEADER_BYTES:
                return Cut(offset, "corrupt_file", f"WARC header at byte {offset} has no end within {MAX_HEADER_BYTES} bytes")
            return Cut(offset, "truncated_file", f"WARC header at byte {offset} is cut off at byte {size} (end of file)")
        length = _CONTENT_LENGTH.search(head[: end + 2])
        if length is None:
            return Cut(offset, "corrupt_file", f"WARC header at byte {offset} has no Content-Length")
        declared = int(length.group(1))
        content_end = offset + end + 4 + declared
        if content_end > size:
            return Cut(offset, "truncated_file", f"WARC record at byte {offset} declares {declared} content bytes; "
                                                 f"the file ends {content_end - size} bytes before they do")
        offset = content_end
    return None

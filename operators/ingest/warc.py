"""WARC files (.warc, .warc.gz): HTTP response records, HTML turned into main text.

Records are parsed with FastWARC (fast, handles gzip members); HTML main-text extraction
uses trafilatura (Barbaresi 2021), which drops navigation and boilerplate.
``source_offset`` is the record's byte offset in the (compressed) file.
"""

from __future__ import annotations

from collections.abc import Iterator

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader

HTML_TYPES = ("text/html", "application/xhtml+xml")


@register_reader
class WarcReader(Reader):
    format = "warc"
    suffixes = (".warc", ".warc.gz", ".warc.zst", ".arc.gz")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        import trafilatura
        from fastwarc.warc import ArchiveIterator, WarcRecordType

        with self.open(file) as stream:
            offset = 0
            try:
                for record in ArchiveIterator(stream, record_types=WarcRecordType.response, parse_http=True):
                    offset = int(record.stream_pos)
                    payload = record.reader.read(self.max_record_bytes + 1)
                    meta = {
                        "url": record.headers.get("WARC-Target-URI"),
                        "warc_record_id": record.record_id,
                        "warc_date": record.headers.get("WARC-Date"),
                        "content_type": record.http_content_type,
                    }
                    if len(payload) > self.max_record_bytes:
                        buffer.quarantine(offset, "oversize", f"payload > max_record_bytes={self.max_record_bytes}", payload)
                        yield None
                        continue
                    content_type = (record.http_content_type or "").lower()
                    if content_type.startswith("text/plain"):
                        text = self.decode(payload, offset, buffer)
                    elif content_type.startswith(HTML_TYPES) or not content_type:
                        html = payload.decode(record.http_charset or "utf-8", errors="replace")
                        text = trafilatura.extract(html, include_comments=False, include_tables=True, deduplicate=False)
                        if text is None:
                            buffer.quarantine(offset, "no_text_extracted", f"no main text in HTML of {meta['url']}", payload)
                            yield None
                            continue
                    else:
                        buffer.quarantine(offset, "unsupported_content_type", content_type, payload[:256])
                        yield None
                        continue
                    if text is not None:
                        buffer.sample(text, offset, meta)
                    yield None
            except (EOFError, OSError, ValueError) as exc:
                buffer.quarantine(offset, "truncated_file", f"{type(exc).__name__}: {exc}", None)
                yield None

"""JSON Lines (plain, .gz, .zst): one JSON object per line; ``source_offset`` = 1-based line number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader, text_field_problem
from operators.ingest.compression import InvalidStreamError, decompress

UTF8_BOM = b"\xef\xbb\xbf"


@register_reader
class JsonlReader(Reader):
    format = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson", ".jsonl.zstd")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        for item in json_objects(self, file, buffer):
            if item is not None:
                line_no, record, line = item
                absent = file.text_field not in record
                body = record.pop(file.text_field, None)
                if isinstance(body, str):
                    buffer.sample(body, line_no, record)
                else:
                    reason = "missing_text_field" if body is None else "text_not_a_string"
                    buffer.quarantine(line_no, reason, text_field_problem(file.text_field, body, absent, list(record)), line)
            yield None


def json_objects(reader: Reader, file: InputFile, buffer: _Buffer) -> Iterator[tuple[int, dict[str, Any], bytes] | None]:
    """The JSON objects of a JSON Lines file (plain, .gz, .zst) as ``(line number, object, line)``: the line loop of
    every JSON Lines reader (text, chat, preference, trajectory, image_text).

    A line that is not one (oversize, not UTF-8, not JSON, not an object) is quarantined with its reason and line
    number and gives None; a line longer than ``max_record_bytes`` is never held whole in memory. Blank lines are
    not records; a UTF-8 byte order mark before the first line is not part of it.
    """
    line_no = 0
    limit = reader.max_record_bytes
    with reader.open(file) as raw_stream:
        stream = decompress(raw_stream, file.uri)
        while True:
            try:
                line = stream.readline(limit + 2)  # bounded: a line without newline can not eat all memory
            except InvalidStreamError as exc:
                buffer.quarantine(0, "invalid_stream", str(exc), None)
                yield None
                return
            except (EOFError, OSError) as exc:
                buffer.quarantine(line_no + 1, "truncated_file", f"{type(exc).__name__}: {exc} after line {line_no}", None)
                yield None
                return
            if not line:
                return
            line_no += 1
            if len(line) > limit + 1 and not line.endswith(b"\n"):
                size = len(line)
                while True:  # skip the rest of the oversize line
                    more = stream.readline(1 << 20)
                    size += len(more)
                    if not more or more.endswith(b"\n"):
                        break
                buffer.quarantine(line_no, "oversize", f"line of >= {size} bytes > max_record_bytes={limit}", line)
                yield None
                continue
            line = line.rstrip(b"\r\n")
            if line_no == 1 and line.startswith(UTF8_BOM):  # a file written as utf-8-sig
                line = line[len(UTF8_BOM):]
            if not line.strip():
                continue
            text = reader.decode(line, line_no, buffer)
            if text is None:
                yield None
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                buffer.quarantine(line_no, "invalid_json", str(exc), line)
                yield None
                continue
            if not isinstance(record, dict):
                buffer.quarantine(line_no, "not_an_object", f"JSON {type(record).__name__}, expected an object", line)
                yield None
                continue
            yield line_no, record, line

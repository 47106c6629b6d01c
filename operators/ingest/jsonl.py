"""JSON Lines (plain, .gz, .zst): one JSON object per line; ``source_offset`` = 1-based line number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from operators.ingest.base import InputFile, Reader, _Buffer, register_reader, text_field_problem
from operators.ingest.compression import InvalidStreamError, decompress


@register_reader
class JsonlReader(Reader):
    format = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson", ".jsonl.zstd")

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        line_no = 0
        with self.open(file) as raw_stream:
            stream = decompress(raw_stream, file.uri)
            while True:
                try:
                    # readline bounded: a line without newline can not eat all memory
                    line = stream.readline(self.max_record_bytes + 2)
                except InvalidStreamError as exc:  # a 0-byte .gz / .zst: the file, not a record, is bad
                    buffer.quarantine(0, "invalid_stream", str(exc), None)
                    yield None
                    return
                except (EOFError, OSError) as exc:  # truncated gzip / zstd, corrupt stream
                    buffer.quarantine(line_no + 1, "truncated_file", f"{type(exc).__name__}: {exc} after line {line_no}", None)
                    yield None
                    return
                if not line:
                    return
                line_no += 1
                if len(line) > self.max_record_bytes + 1 and not line.endswith(b"\n"):
                    size = len(line)
                    while True:  # skip the rest of the oversize line
                        more = stream.readline(1 << 20)
                        size += len(more)
                        if not more or more.endswith(b"\n"):
                            break
                    buffer.quarantine(line_no, "oversize", f"line of >= {size} bytes > max_record_bytes={self.max_record_bytes}", line)
                    yield None
                    continue
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue  # blank lines are not records
                text = self.decode(line, line_no, buffer)
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
                absent = file.text_field not in record
                body = record.pop(file.text_field, None)
                if not isinstance(body, str):
                    reason = "missing_text_field" if body is None else "text_not_a_string"
                    buffer.quarantine(line_no, reason, text_field_problem(file.text_field, body, absent, list(record)), line)
                    yield None
                    continue
                buffer.sample(body, line_no, record)
                yield None


def json_objects(reader: Reader, file: InputFile, buffer: _Buffer) -> Iterator[tuple[int, dict[str, Any], bytes] | None]:
    """The JSON objects of a JSON Lines file (plain, .gz, .zst) as ``(line number, object, line)``, for readers of
    structured kinds (chat, preference, trajectory, image_text).

    A line that is not one (oversize, not UTF-8, not JSON, not an object) is quarantined with its reason and line
    number and gives None; a line longer than ``max_record_bytes`` is never held whole in memory. Blank lines are
    not records.
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

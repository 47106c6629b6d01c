"""Readers on real files, good and broken: every record is a sample or a quarantine row."""

from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from operators.ingest.base import InputFile, detect_format, reader_for


def read_all(path, fmt=None, *, max_record_bytes=10_000, text_field="text"):
    uri = str(path)
    fmt = fmt or detect_format(uri)
    file = InputFile(uri=uri, size=path.stat().st_size, etag="", mtime="", format=fmt, text_field=text_field)
    reader = reader_for(fmt)(max_record_bytes=max_record_bytes, batch_rows=7)  # small batches: exercise flushing
    batches = list(reader.read(file))
    samples = pa.concat_tables([b.samples for b in batches])
    bad = pa.concat_tables([b.quarantine for b in batches])
    return samples, bad


def jsonl_lines(n):
    return [json.dumps({"text": f"document number {i} " * 3, "id": i}).encode() for i in range(n)]


@pytest.mark.parametrize("suffix,compress", [
    (".jsonl", lambda b: b),
    (".jsonl.gz", lambda b: gzip.compress(b, mtime=0)),
    (".jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b)),
])
def test_jsonl_all_compressions(tmp_path, suffix, compress):
    path = tmp_path / f"docs{suffix}"
    path.write_bytes(compress(b"\n".join(jsonl_lines(50)) + b"\n"))
    samples, bad = read_all(path)
    assert samples.num_rows == 50 and bad.num_rows == 0
    assert samples.column("source_offset").to_pylist() == list(range(1, 51))  # 1-based line numbers
    assert json.loads(samples.column("meta")[3].as_py()) == {"id": 3}
    assert set(samples.column("source_format").to_pylist()) == {"jsonl"}


def test_jsonl_broken_records_are_quarantined_with_reason_and_line(tmp_path):
    lines = jsonl_lines(10)
    lines[2] = b'{"text": "unterminated'
    lines[4] = b'{"text": "caf\xe9 latin-1"}'
    lines[6] = b'[1, 2, 3]'
    lines[7] = b'{"body": "no text"}'
    lines[8] = b'{"text": 42}'
    lines[9] = json.dumps({"text": "y" * 20_000}).encode()
    path = tmp_path / "broken.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n\n")  # a trailing blank line is no record
    samples, bad = read_all(path)
    reasons = dict(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist()))
    assert reasons == {3: "invalid_json", 5: "invalid_utf8", 7: "not_an_object", 8: "missing_text_field",
                       9: "text_not_a_string", 10: "oversize"}
    assert samples.column("source_offset").to_pylist() == [1, 2, 4, 6]
    assert bad.column("raw")[0].as_py() == b'{"text": "unterminated'  # the bad bytes are kept for inspection
    assert bad.column("raw_size")[5].as_py() > 10_000


def test_truncated_gzip_keeps_what_was_readable(tmp_path):
    payload = b"\n".join(jsonl_lines(400)) + b"\n"
    whole = gzip.compress(payload, mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    samples, bad = read_all(path)
    assert 0 < samples.num_rows < 400
    assert bad.column("reason").to_pylist() == ["truncated_file"]
    # the offsets read are a prefix of the file: nothing in the middle was skipped
    assert samples.column("source_offset").to_pylist() == list(range(1, samples.num_rows + 1))


def test_garbage_file_is_one_quarantined_record(tmp_path):
    path = tmp_path / "junk.parquet"
    path.write_bytes(random.Random(1).randbytes(3000))
    samples, bad = read_all(path)
    assert samples.num_rows == 0
    assert bad.column("reason").to_pylist() == ["unreadable_file"]


def test_parquet_text_and_meta_columns(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"content": ["alpha beta", None, "gamma", "z" * 50_000], "lang": ["en", "en", "fr", "en"]}), path)
    samples, bad = read_all(path, text_field="content")
    assert samples.column("text").to_pylist() == ["alpha beta", "gamma"]
    assert [json.loads(m)["lang"] for m in samples.column("meta").to_pylist()] == ["en", "fr"]
    assert dict(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist())) == {1: "missing_text_field", 3: "oversize"}
    _, missing = read_all(path, text_field="body")
    assert missing.column("reason").to_pylist() == ["missing_text_field"]


def test_text_file_is_one_document(tmp_path):
    path = tmp_path / "note.txt"
    path.write_text("First line.\nSecond line.\n")
    samples, bad = read_all(path)
    assert samples.column("text").to_pylist() == ["First line.\nSecond line.\n"] and bad.num_rows == 0


def test_warc_html_to_main_text(tmp_path):
    from data.demo.generate import write_warc  # the demo corpus' own WARC writer

    path = tmp_path / "pages.warc.gz"
    texts = ["The quick brown fox jumps over the lazy dog. " * 8, "Sphinx of black quartz, judge my vow. " * 8]
    write_warc(path, texts)
    samples, bad = read_all(path, max_record_bytes=100_000)
    assert bad.num_rows == 0 and samples.num_rows == 2
    first = samples.column("text")[0].as_py()
    assert "quick brown fox" in first and "Home" not in first  # boilerplate navigation removed
    meta = json.loads(samples.column("meta")[1].as_py())
    assert meta["url"] == "https://www.example.org/page/1"
    offsets = samples.column("source_offset").to_pylist()
    assert offsets[0] == 0 and offsets[1] > 0  # byte offsets of the records


def test_format_detection_error_names_the_file():
    from datahub.errors import OperatorError

    with pytest.raises(OperatorError, match=r"data\.bin: cannot tell the input format"):
        detect_format("s3://bucket/data.bin")

"""Readers on real files, good and broken: every record is a sample or a quarantine row."""

from __future__ import annotations

import gzip
import json
import random
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from operators.ingest.base import InputFile, detect_format, reader_for

REPO = Path(__file__).resolve().parents[3]


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
    # no such column: every row is quarantined, so the file's 4 rows are 4 records (exact accounting)
    assert missing.column("reason").to_pylist() == ["missing_text_field"] * 4
    assert missing.column("source_offset").to_pylist() == [0, 1, 2, 3]
    assert "no field 'body' in the file's columns (its fields: 'content', 'lang')" in missing.column("detail")[0].as_py()


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


# --- truncated and broken inputs: every record is kept, quarantined, or named lost by offset ---

def varied_lines(n):
    """JSON lines of random words: about 200 bytes each, compressing into many zstd blocks (<= 128 KiB each)."""
    rng = random.Random(7)
    words = ["fox", "dog", "quartz", "sphinx", "judge", "vow", "lazy", "brown", "quick", "jumps", "over", "black"]
    return [json.dumps({"text": " ".join(rng.choices(words, k=30)), "id": i}).encode() for i in range(n)]


def test_truncated_zstd_keeps_what_was_readable_like_gzip(tmp_path):
    payload = b"\n".join(varied_lines(4000)) + b"\n"
    whole = zstandard.ZstdCompressor().compress(payload)
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(whole[: len(whole) // 2])
    samples, bad = read_all(path)
    assert 0 < samples.num_rows < 4000
    assert samples.column("source_offset").to_pylist() == list(range(1, samples.num_rows + 1))
    assert bad.column("reason").to_pylist() == ["truncated_file"]
    assert bad.column("source_offset").to_pylist() == [samples.num_rows + 1]  # the line that was cut
    assert "inside a frame" in bad.column("detail")[0].as_py()
    # the same cut in gzip gives the same accounting shape: a prefix of lines, one row at the cut
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(payload, mtime=0)[: len(gzip.compress(payload, mtime=0)) // 2])
    gz_samples, gz_bad = read_all(gz)
    assert gz_bad.column("source_offset").to_pylist() == [gz_samples.num_rows + 1]


def test_zstd_cut_in_a_later_frame_keeps_the_earlier_frames(tmp_path):
    lines = varied_lines(300)
    first, second = b"\n".join(lines[:100]) + b"\n", b"\n".join(lines[100:]) + b"\n"
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    whole = compressor.compress(first) + compressor.compress(second)
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(whole[:-10])  # the second frame loses its last block end and checksum
    samples, bad = read_all(path)
    assert 100 <= samples.num_rows < 300
    assert samples.column("source_offset").to_pylist() == list(range(1, samples.num_rows + 1))
    assert bad.column("reason").to_pylist() == ["truncated_file"]
    path.write_bytes(whole)  # whole frames, concatenated: nothing quarantined
    samples, bad = read_all(path)
    assert samples.num_rows == 300 and bad.num_rows == 0


def test_broken_text_files(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait, ".encode("latin-1") * 10)
    (tmp_path / "big.txt").write_text("word " * 5_000)  # 25,000 bytes
    body = ("A whole paragraph of plain text. " * 200).encode()  # 6,600 bytes
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(body, mtime=0)[:-20])
    (tmp_path / "cut.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(body)[:-20])
    (tmp_path / "fine.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(body))
    expected = {"latin1.txt": "invalid_utf8", "big.txt": "oversize", "cut.txt.gz": "truncated_file",
                "cut.txt.zst": "truncated_file"}
    for name, reason in expected.items():
        samples, bad = read_all(tmp_path / name)
        assert samples.num_rows == 0, name  # one document per file: a broken file keeps no partial text
        assert list(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist())) == [(0, reason)], name
    assert read_all(tmp_path / "latin1.txt")[1].column("raw")[0].as_py().startswith(b"caf\xe9")
    assert read_all(tmp_path / "big.txt")[1].column("raw_size")[0].as_py() > 10_000
    samples, bad = read_all(tmp_path / "fine.txt.zst")
    assert samples.column("text").to_pylist() == [body.decode()] and bad.num_rows == 0


DEMO_WARC = REPO / "data" / "demo" / "pages.warc.gz"


def _warc_variants(tmp_path):
    """The demo WARC as .warc.gz (a gzip member per record), .warc and .warc.zst (a frame per record)."""
    members, rest = [], DEMO_WARC.read_bytes()
    while rest:
        member = zlib.decompressobj(wbits=31)
        members.append(member.decompress(rest))
        rest = member.unused_data
    variants = {
        "pages.warc.gz": DEMO_WARC.read_bytes(),
        "pages.warc": b"".join(members),
        "pages.warc.zst": b"".join(zstandard.ZstdCompressor().compress(m) for m in members),
    }
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
    return variants


@pytest.mark.parametrize("name", ["pages.warc.gz", "pages.warc", "pages.warc.zst"])
@pytest.mark.parametrize("fraction", [0.8, 0.97])
def test_truncated_warc_never_loses_records_silently(tmp_path, name, fraction):
    data = _warc_variants(tmp_path)[name]
    whole, whole_bad = read_all(tmp_path / name, max_record_bytes=100_000)
    offsets = whole.column("source_offset").to_pylist()
    assert len(offsets) == 10 and whole_bad.num_rows == 0
    cut = tmp_path / f"cut-{name}"
    cut.write_bytes(data[: int(len(data) * fraction)])
    samples, bad = read_all(cut, max_record_bytes=100_000)
    kept = samples.num_rows
    assert kept == (8 if fraction == 0.8 else 9)
    # the records kept are the whole ones before the cut, with their text intact
    assert samples.column("source_offset").to_pylist() == offsets[:kept]
    assert samples.column("text").to_pylist() == whole.column("text").to_pylist()[:kept]
    # one quarantine row names the offset of the first record not kept: a partial record is never a sample
    assert bad.column("source_offset").to_pylist() == [offsets[kept]]
    assert bad.column("reason")[0].as_py() in ("truncated_file", "truncated_record")
    assert str(offsets[kept]) in bad.column("detail")[0].as_py()


def test_warc_oversize_record_is_quarantined_others_kept(tmp_path):
    from data.demo.generate import write_warc

    path = tmp_path / "big.warc.gz"
    texts = ["A short page about foxes and dogs. " * 10, "An enormous page. " * 2_000, "Another short page on quartz. " * 10]
    write_warc(path, texts)
    samples, bad = read_all(path, max_record_bytes=5_000)
    whole, _ = read_all(path, max_record_bytes=100_000)
    offsets = whole.column("source_offset").to_pylist()
    assert samples.column("source_offset").to_pylist() == [offsets[0], offsets[2]]
    assert list(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist())) == [(offsets[1], "oversize")]
    assert bad.column("raw_size")[0].as_py() > 5_000


def _warc_record(warc_type, uri, block, index, content_type):
    header = (f"WARC/1.1\r\nWARC-Type: {warc_type}\r\nWARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-{index:012d}>\r\n"
              f"WARC-Date: 2026-01-01T00:00:00Z\r\nWARC-Target-URI: {uri}\r\nContent-Type: {content_type}\r\n"
              f"Content-Length: {len(block)}\r\n\r\n").encode()
    return gzip.compress(header + block + b"\r\n\r\n", mtime=0)


def _http_response(text):
    body = f"<html><body><article><p>{text}</p></article></body></html>".encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def test_warc_record_types(tmp_path):
    http = "application/http; msgtype=response"
    records = [
        _warc_record("warcinfo", "", b"software: test\r\n", 0, "application/warc-fields"),
        _warc_record("request", "https://a.example/", b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", 1, "application/http; msgtype=request"),
        _warc_record("response", "https://a.example/", _http_response("The first page has enough words to be kept. " * 5), 2, http),
        _warc_record("metadata", "https://a.example/", b"fetchTimeMs: 12\r\n", 3, "application/warc-fields"),
        _warc_record("revisit", "https://b.example/", b"HTTP/1.1 200 OK\r\n\r\n", 4, http),
        _warc_record("response", "https://c.example/", _http_response("The third page is also long enough to keep. " * 5), 5, http),
    ]
    path = tmp_path / "types.warc.gz"
    path.write_bytes(b"".join(records))
    starts = [sum(len(r) for r in records[:i]) for i in range(len(records))]
    samples, bad = read_all(path, max_record_bytes=100_000)
    # responses are samples; warcinfo, request and metadata describe the capture and are skipped
    assert samples.column("source_offset").to_pylist() == [starts[2], starts[5]]
    assert [json.loads(m)["url"] for m in samples.column("meta").to_pylist()] == ["https://a.example/", "https://c.example/"]
    assert list(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist())) == [(starts[4], "unsupported_record_type")]
    assert "revisit" in bad.column("detail")[0].as_py()


def test_garbage_warc_is_quarantined_not_empty(tmp_path):
    for name in ("junk.warc.gz", "junk.warc"):
        path = tmp_path / name
        path.write_bytes(random.Random(2).randbytes(3000))
        samples, bad = read_all(path)
        assert samples.num_rows == 0 and bad.num_rows == 1, name
        assert bad.column("reason")[0].as_py() in ("corrupt_file", "unreadable_file"), name


# --- storage failures are not bad data: a reader raises them for the caller to retry ---

def _closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.zst", "t.parquet", "note.txt.gz", "pages.warc.gz"])
def test_unreachable_storage_raises_storage_error_not_quarantine(name):
    from datahub.errors import StorageError

    # a real s3fs filesystem on a loopback port nobody listens on; botocore's own retries off for speed
    options = (("key", "k"), ("secret", "s"), ("skip_instance_cache", True),
               ("client_kwargs", {"endpoint_url": f"http://127.0.0.1:{_closed_port()}", "region_name": "us-east-1"}),
               ("config_kwargs", {"retries": {"max_attempts": 1}}))
    uri = f"s3://bucket/{name}"
    file = InputFile(uri=uri, size=100, etag="", mtime="", format=detect_format(uri), storage_options=options)
    reader = reader_for(file.format)(max_record_bytes=10_000)
    with pytest.raises(StorageError, match=rf"open s3://bucket/{name}: storage did not answer") as error:
        list(reader.read(file))
    assert type(error.value.__cause__).__name__ == "EndpointConnectionError"


@pytest.mark.parametrize("name", ["docs.jsonl.zst", "docs.jsonl.gz", "doc.txt.zst", "doc.txt.gz", "crawl.warc.gz"])
def test_zero_byte_compressed_file_is_quarantined_as_invalid_stream(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    samples, bad = read_all(path)
    assert samples.num_rows == 0
    assert bad.column("reason").to_pylist() == ["invalid_stream"]
    assert "0-byte" in bad.column("detail")[0].as_py() and "re-create it or remove it" in bad.column("detail")[0].as_py()


@pytest.mark.parametrize("suffix,compress", [
    (".jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    (".jsonl.gz", lambda b: gzip.compress(b, mtime=0)),
])
def test_compressed_empty_data_is_a_valid_empty_file(tmp_path, suffix, compress):
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(compress(b""))  # a header and a frame/member holding nothing: valid, no records
    samples, bad = read_all(path)
    assert samples.num_rows == 0 and bad.num_rows == 0


def test_null_and_absent_text_say_which(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": null, "id": 1}\n{"body": "x", "id": 2}\n{"text": 7}\n')
    _, bad = read_all(path)
    details = dict(zip(bad.column("source_offset").to_pylist(), bad.column("detail").to_pylist()))
    assert details[1] == "field 'text' is null"
    assert details[2].startswith("no field 'text' in the record (its fields: 'body', 'id')") and "text_field:" in details[2]
    assert details[3] == "field 'text' is a int, not a string"
    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["ok", None]}), parquet)
    _, bad = read_all(parquet)
    assert bad.column("detail").to_pylist() == ["row 1: field 'text' is null"]


@pytest.mark.parametrize("kind,record", [
    ("text", {"text": "first document"}),
    ("chat", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}),
    ("image_text", {"caption": "first", "image_path": "missing.jpg"}),
])
def test_a_utf8_byte_order_mark_does_not_cost_the_first_record(tmp_path, kind, record):
    """Files written with utf-8-sig (Windows tools, pandas encoding='utf-8-sig') start with EF BB BF: the first
    line was quarantined as invalid_json ('Unexpected UTF-8 BOM')."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(record).encode() + b"\r\n" + json.dumps(record).encode() + b"\n")
    file = InputFile(uri=str(path), size=path.stat().st_size, etag="", mtime="", format="jsonl", kind=kind,
                     text_field="caption" if kind == "image_text" else "text")
    batches = list(reader_for("jsonl", kind)(max_record_bytes=10_000).read(file))
    reasons = [r for b in batches for r in b.quarantine.column("reason").to_pylist()]
    samples = sum(b.samples.num_rows for b in batches)
    if kind == "image_text":  # the picture is not there: both lines reach the image check alike
        assert reasons == ["image_not_found", "image_not_found"]
    else:
        assert reasons == [] and samples == 2

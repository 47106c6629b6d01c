"""Image-text readers: WebDataset shards, Parquet with bytes or paths, JSONL with paths; bad media quarantined."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.ingest.base import InputFile, reader_for
from tests.operators.media.conftest import IMAGES, image_of


def read(path: Path, fmt: str, text_field: str = "text") -> tuple[pa.Table, pa.Table]:
    file = InputFile(uri=str(path), size=path.stat().st_size, etag="", mtime="", format=fmt, text_field=text_field,
                     kind="image_text")
    batches = list(reader_for(fmt, "image_text")(max_record_bytes=20_000_000, batch_rows=16).read(file))
    return (pa.concat_tables([b.samples for b in batches]), pa.concat_tables([b.quarantine for b in batches]))


def test_webdataset_shard_every_sample_accounted_for(demo_members, truth):
    samples, bad = read(IMAGES / "demo-00000.tar", "webdataset")
    assert samples.num_rows + bad.num_rows == len(demo_members)
    assert Counter(bad.column("reason").to_pylist()) == Counter(
        t["reason"] for k, t in truth.items() if t["reason"] and k in demo_members)
    first = samples.slice(0, 1).to_pylist()[0]
    key = json.loads(first["meta"])["key"]
    assert first["image"] == image_of(demo_members[key]) and first["text"] == demo_members[key]["txt"].decode()
    assert first["kind"] == "image_text" and first["image_width"] > 0 and first["source_offset"] == 0


def _shard(path: Path, samples: dict[str, dict[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_webdataset_caption_from_json_and_missing_parts(tmp_path, demo_members):
    picture = image_of(demo_members["img00000"])
    path = _shard(tmp_path / "s.tar", {
        "a": {"jpg": picture, "json": json.dumps({"caption": "from json", "url": "http://x"}).encode()},
        "b": {"txt": b"no picture"},
        "c": {"jpg": picture},
        "d": {"jpg": picture, "txt": b"bad json", "json": b"{not json"},
    })
    samples, bad = read(path, "webdataset")
    assert samples.column("text").to_pylist() == ["from json"]
    assert json.loads(samples.column("meta")[0].as_py()) == {"key": "a", "url": "http://x"}
    assert dict(zip(bad.column("source_offset").to_pylist(), bad.column("reason").to_pylist())) == {
        1: "missing_image", 2: "missing_caption", 3: "invalid_json"}


def test_truncated_shard_keeps_what_was_read(tmp_path, demo_members):
    picture = image_of(demo_members["img00000"])
    whole = _shard(tmp_path / "whole.tar", {f"k{i}": {"jpg": picture, "txt": b"cap"} for i in range(4)}).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: len(whole) * 3 // 5])
    samples, bad = read(cut, "webdataset")
    assert samples.num_rows >= 1 and bad.column("reason").to_pylist()[-1] in ("unreadable_file", "undecodable_image")


def test_parquet_bytes_and_jsonl_paths(tmp_path, demo_members):
    samples, bad = read(IMAGES / "pairs.parquet", "parquet", text_field="caption")
    assert bad.num_rows == 0 and samples.num_rows == pq.read_metadata(IMAGES / "pairs.parquet").num_rows
    assert json.loads(samples.column("meta")[0].as_py())["key"].startswith("pq-")
    samples, bad = read(IMAGES / "refs.jsonl", "jsonl", text_field="caption")
    assert bad.column("reason").to_pylist() == ["image_not_found"] and "missing.jpg" in bad.column("detail")[0].as_py()
    assert all(uri.startswith(str(IMAGES / "files")) for uri in samples.column("image_uri").to_pylist())
    for uri, data in zip(samples.column("image_uri").to_pylist(), samples.column("image").to_pylist()):
        assert Path(uri).read_bytes() == data


def test_parquet_datasets_image_struct_and_path_column(tmp_path, demo_members):
    picture = image_of(demo_members["img00000"])
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.jpg").write_bytes(picture)
    pq.write_table(pa.table({"caption": ["struct", "path", "none"],
                             "image": [{"bytes": picture, "path": None}, None, None],
                             "image_path": [None, "pics/a.jpg", None]}), tmp_path / "hf.parquet")
    samples, bad = read(tmp_path / "hf.parquet", "parquet", text_field="caption")
    assert samples.column("text").to_pylist() == ["struct", "path"]
    assert samples.column("image").to_pylist() == [picture, picture]
    assert bad.column("reason").to_pylist() == ["missing_image"]


def test_text_format_without_image_reader_is_refused():
    from datahub.errors import OperatorError

    with pytest.raises(OperatorError, match="image_text"):
        reader_for("warc", "image_text")


def test_image_batches_are_bounded(tmp_path, demo_members):
    picture = image_of(demo_members["img00000"])
    path = _shard(tmp_path / "many.tar", {f"k{i:03d}": {"jpg": picture, "txt": b"cap"} for i in range(150)})
    file = InputFile(uri=str(path), size=path.stat().st_size, etag="", mtime="", format="webdataset", kind="image_text")
    batches = list(reader_for("webdataset", "image_text")(max_record_bytes=20_000_000).read(file))
    sizes = [b.samples.num_rows for b in batches]
    assert sum(sizes) == 150 and max(sizes) <= 64


def _refs(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_compressed_image_jsonl_is_decompressed(tmp_path, demo_members, suffix):
    """A gzip/zstd refs file was read as raw bytes: every record became one `invalid_json` of binary noise."""
    import gzip

    import zstandard

    (tmp_path / "a.jpg").write_bytes(image_of(demo_members["img00000"]))
    body = b"".join(json.dumps({"image_path": "a.jpg", "caption": f"cap {i}"}).encode() + b"\n" for i in range(3))
    data = gzip.compress(body) if suffix.endswith("gz") else zstandard.ZstdCompressor().compress(body)
    path = tmp_path / f"refs{suffix}"
    path.write_bytes(data)
    samples, bad = read(path, "jsonl", text_field="caption")
    assert bad.num_rows == 0 and samples.column("text").to_pylist() == ["cap 0", "cap 1", "cap 2"]
    assert samples.column("source_offset").to_pylist() == [1, 2, 3]


def test_image_jsonl_bad_lines_name_the_reason_and_keep_the_record(tmp_path, demo_members):
    (tmp_path / "a.jpg").write_bytes(image_of(demo_members["img00000"]))
    path = _refs(tmp_path / "refs.jsonl", [
        b'{"image_path": "a.jpg", "caption": "latin-1 \xe9t\xe9"}\n',   # not UTF-8: invalid_utf8, not invalid_json
        b'{"image_path": "a.jpg"}\n',                                   # no caption: the record is kept, fields named
        b'{"image_path": "a.jpg", "caption": 5}\n',
        b'{"caption": "no image", "note": 1}\n',
        b'{"image_path": "a.jpg", "caption": "good"}\n',
    ])
    samples, bad = read(path, "jsonl", text_field="caption")
    assert samples.column("text").to_pylist() == ["good"]
    rows = bad.to_pylist()
    assert [r["reason"] for r in rows] == ["invalid_utf8", "missing_caption", "caption_not_a_string", "missing_image"]
    assert [r["source_offset"] for r in rows] == [1, 2, 3, 4]
    lines = path.read_bytes().splitlines(keepends=True)
    for row, line in zip(rows, lines):
        assert row["raw"].rstrip(b"\n") == line.rstrip(b"\n"), row  # the quarantined record is the line, whole
    assert "'image_path'" in rows[1]["detail"]  # "its fields: 'image_path'", not "none"


def _peak_of_reading(tmp_path: Path, path: Path, fmt: str, max_record_bytes: int) -> tuple[int, list[str]]:
    """Peak Python allocation (tracemalloc) of reading ``path`` in a fresh interpreter, and the quarantine reasons."""
    import subprocess
    import sys

    script = f"""
import json, tracemalloc
from operators.ingest.base import InputFile, reader_for
path = {str(path)!r}
f = InputFile(uri=path, size=0, etag="", mtime="", format={fmt!r}, text_field="caption", kind="image_text")
tracemalloc.start()
reasons = []
for b in reader_for({fmt!r}, "image_text")(max_record_bytes={max_record_bytes}).read(f):
    reasons += b.quarantine.column("reason").to_pylist()
print(json.dumps([tracemalloc.get_traced_memory()[1], reasons]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[3]))
    peak, reasons = json.loads(out.stdout.strip().splitlines()[-1])
    return peak, reasons


def test_an_oversize_image_jsonl_line_is_not_read_whole(tmp_path, demo_members):
    """A 60 MB line under max_record_bytes=1 MB was read into memory whole (peak ~120 MB) before being refused."""
    (tmp_path / "a.jpg").write_bytes(image_of(demo_members["img00000"]))
    path = tmp_path / "big.jsonl"
    with path.open("wb") as out:
        out.write(b'{"caption": "' + b"x" * 60_000_000 + b'"}\n')
        out.write(json.dumps({"image_path": "a.jpg", "caption": "small"}).encode() + b"\n")
    peak, reasons = _peak_of_reading(tmp_path, path, "jsonl", 1_000_000)
    assert reasons == ["oversize"]
    assert peak < 20_000_000, peak


def test_an_oversize_webdataset_member_is_not_read_whole(tmp_path, demo_members):
    """A 60 MB member under max_record_bytes=1 MB was read whole before the size check (peak ~60 MB)."""
    picture = image_of(demo_members["img00000"])
    path = _shard(tmp_path / "s.tar", {"k1": {"jpg": b"\xff" * 60_000_000, "txt": b"big"},
                                       "k2": {"jpg": picture, "txt": b"fine"}})
    peak, reasons = _peak_of_reading(tmp_path, path, "webdataset", 1_000_000)
    assert reasons == ["oversize"]
    assert peak < 20_000_000, peak
    samples, bad = read(path, "webdataset")  # the next sample is read after the skipped member
    assert samples.column("text").to_pylist() == ["fine"]


def test_webdataset_oversize_member_names_the_member(tmp_path, demo_members):
    picture = image_of(demo_members["img00000"])
    caption = b"x" * (len(picture) + 5000)  # a caption member over the limit: checked like the image
    path = _shard(tmp_path / "s.tar", {"k1": {"jpg": picture, "txt": caption}, "k2": {"jpg": picture, "txt": b"ok"}})
    file = InputFile(uri=str(path), size=path.stat().st_size, etag="", mtime="", format="webdataset", kind="image_text")
    batches = list(reader_for("webdataset", "image_text")(max_record_bytes=len(picture) + 100).read(file))
    bad = pa.concat_tables([b.quarantine for b in batches]).to_pylist()
    samples = pa.concat_tables([b.samples for b in batches])
    assert samples.column("text").to_pylist() == ["ok"]
    assert [(r["reason"], r["source_offset"]) for r in bad] == [("oversize", 0)]
    assert bad[0]["detail"].startswith(f"k1.txt: {len(caption)} bytes > max_record_bytes=")
    assert bad[0]["raw"] == caption[:4096]  # a preview: the member was not read whole


def test_parquet_datasets_image_struct_with_only_a_path_is_fetched(tmp_path, demo_members):
    """datasets.Image stored as {bytes: None, path: ...} (not embedded) gave missing_image 'no image path'."""
    picture = image_of(demo_members["img00000"])
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.jpg").write_bytes(picture)
    pq.write_table(pa.table({"caption": ["by path", "gone"],
                             "image": [{"bytes": None, "path": "pics/a.jpg"}, {"bytes": None, "path": "pics/no.jpg"}]}),
                   tmp_path / "hf.parquet")
    samples, bad = read(tmp_path / "hf.parquet", "parquet", text_field="caption")
    assert samples.column("text").to_pylist() == ["by path"] and samples.column("image").to_pylist() == [picture]
    assert samples.column("image_uri").to_pylist() == [str(tmp_path / "pics" / "a.jpg")]
    assert bad.column("reason").to_pylist() == ["image_not_found"]


def test_web_image_urls_that_fail_are_quarantined_not_a_failed_input(tmp_path, demo_members):
    """LAION-style refs name web images by `url`; one dead link (connection refused, 404) raised StorageError for
    the whole input file (retried, then the run failed) instead of quarantining that record."""
    import functools
    import http.server
    import socket
    import threading

    picture = image_of(demo_members["img00000"])
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "a.jpg").write_bytes(picture)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "web"))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nothing listens on: connection refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        path = _refs(tmp_path / "refs.jsonl", [json.dumps(r).encode() + b"\n" for r in [
            {"url": f"{base}/a.jpg", "caption": "served"},
            {"url": f"{base}/gone.jpg", "caption": "404"},
            {"url": f"http://127.0.0.1:{closed}/x.jpg", "caption": "refused"},
            {"url": f"{base}/a.jpg", "caption": "served again"},
        ]])
        samples, bad = read(path, "jsonl", text_field="caption")
    finally:
        server.shutdown()
        server.server_close()
    assert samples.column("text").to_pylist() == ["served", "served again"]
    assert samples.column("image").to_pylist() == [picture, picture]
    rows = bad.to_pylist()
    # a dead host is not known to have lost the image: image_fetch_failed (worth ingesting again), the cause named
    assert [(r["source_offset"], r["reason"]) for r in rows] == [(2, "image_not_found"), (3, "image_fetch_failed")]
    assert "gone.jpg" in rows[0]["detail"] and "HTTP 404" in rows[0]["detail"]
    assert f":{closed}/x.jpg" in rows[1]["detail"] and "ConnectionRefusedError" in rows[1]["detail"]


def test_webdataset_json_member_that_is_not_an_object_is_kept_in_meta(tmp_path, demo_members):
    """A KEY.json holding a list or a string was dropped without a word; it is kept under meta['json']."""
    picture = image_of(demo_members["img00000"])
    path = _shard(tmp_path / "s.tar", {"a": {"jpg": picture, "txt": b"cap", "json": b'["tag1", "tag2"]'}})
    samples, bad = read(path, "webdataset")
    assert bad.num_rows == 0
    assert json.loads(samples.column("meta")[0].as_py()) == {"json": ["tag1", "tag2"], "key": "a"}

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

"""What each decode mode yields, built from the bytes the fixture wrote; a missing .txt names shard and sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datahub.errors import IntegrityError
from datahub.loader.dataset import ReleaseDataset
from tests.loader.shards import all_ids, write_release


def _samples(tmp_path: Path, **kwargs) -> list:
    return list(ReleaseDataset(str(tmp_path / "manifest.json"), rank=0, world_size=1, shuffle=False, **kwargs))


def test_text_json_bytes_and_callable_modes(tmp_path: Path) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(3, 2), with_binary=True, text_bytes=300)
    ids = all_ids(manifest)
    text = _samples(tmp_path, decode="text")
    assert [s["sample_id"] for s in text] == ids
    assert all(set(s) == {"sample_id", "text", "is_padding"} and s["is_padding"] is False for s in text)
    assert all(isinstance(s["text"], str) and s["sample_id"] in s["text"] and len(s["text"]) == 300 for s in text)
    as_json = _samples(tmp_path, decode="json")
    assert [s["meta"]["sample_id"] for s in as_json] == ids and [s["text"] for s in as_json] == [s["text"] for s in text]
    raw = _samples(tmp_path, decode="bytes")
    assert [json.loads(s["json"])["sample_id"] for s in raw] == ids
    assert [s["txt"].decode() for s in raw] == [s["text"] for s in text] and all(len(s["bin"]) == 5 for s in raw)
    custom = _samples(tmp_path, decode=lambda sample: (sample["sample_id"], sorted(sample)))
    assert custom == [(i, ["bin", "is_padding", "json", "sample_id", "txt"]) for i in ids]


def test_batches_hold_the_same_samples_in_order(tmp_path: Path) -> None:
    write_release(tmp_path, samples_per_shard=(7, 7, 5))
    flat = [s["sample_id"] for s in _samples(tmp_path)]
    batches = _samples(tmp_path, batch_size=4)
    assert [len(b) for b in batches] == [4, 4, 4, 4, 3]
    assert [s["sample_id"] for b in batches for s in b] == flat


def test_sample_without_text_member_is_an_integrity_error(tmp_path: Path) -> None:
    manifest = write_release(tmp_path, samples_per_shard=(2,))
    path = Path(manifest["shards"][0]["replicas"]["cfs"])
    data = bytearray(path.read_bytes())
    name = f"{all_ids(manifest)[0]}.txt".encode()
    data[0 : len(name)] = name.replace(b".txt", b".md\x00")  # the first member is no longer a .txt
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=rf"{manifest['shards'][0]['name']}: sample {all_ids(manifest)[0]} has no .txt"):
        _samples(tmp_path, verify=False)


def test_arrow_batch_columns_from_buffers_keep_non_ascii_ids_padding_and_utf8_checks() -> None:
    # the columns are made from buffers (no pa.array, which imports pandas): byte lengths of non-ASCII sample ids,
    # the padding bitmap past one byte, and invalid UTF-8 text still refused
    import numpy as np

    from datahub.loader.decode import arrow_batch_from_columns

    ids = ["a", "é-1", "", "日本", *(f"s{i}" for i in range(9))]
    texts = [f"text {i} ü".encode() for i in range(len(ids))]
    padding = np.array([i % 3 == 0 for i in range(len(ids))])
    batch = arrow_batch_from_columns(ids, [memoryview(t) for t in texts], np.array([len(t) for t in texts]), padding)
    batch.validate(full=True)
    assert batch.schema.names == ["sample_id", "text", "is_padding"]
    assert batch.column("sample_id").to_pylist() == ids
    assert batch.column("text").to_pylist() == [t.decode() for t in texts]
    assert batch.column("is_padding").to_pylist() == padding.tolist()
    empty = arrow_batch_from_columns([], [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    assert empty.num_rows == 0 and empty.schema == batch.schema
    with pytest.raises(Exception, match="(?i)utf-?8"):
        arrow_batch_from_columns(["x"], [memoryview(b"\xff")], np.array([1]), np.array([False]))

"""What each decode mode yields, built from the bytes the fixture wrote; a missing .txt names shard and sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def _image_release(root: Path, images: dict[str, bytes]) -> str:
    """One shard of image-text samples (KEY.jpg, KEY.txt, KEY.json, as the export writes them) and its manifest."""
    import hashlib
    import io
    import tarfile

    from tests.loader.shards import _add

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, data in images.items():
            _add(tar, f"{key}.jpg", data)
            _add(tar, f"{key}.txt", f"caption of {key}".encode())
            _add(tar, f"{key}.json", json.dumps({"sample_id": key}).encode())
    data = buffer.getvalue()
    (root / "cfs").mkdir(parents=True)
    (root / "cfs" / "img-000000.tar").write_bytes(data)
    manifest = {"manifest_version": 1, "release": "img", "created": "2026-12-07T00:00:00Z", "table_version": 1,
                "release_digest": "ab" * 32, "num_samples": len(images), "shuffle_seed": 0,
                "shards": [{"name": "img-000000.tar", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "samples": len(images), "replicas": {"cfs": str(root / "cfs" / "img-000000.tar")}}]}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return str(root / "manifest.json")


@pytest.mark.parametrize("decode", ["pil", "numpy"])
def test_an_exif_rotated_photo_is_decoded_upright(tmp_path: Path, decode: str) -> None:
    # a phone photo kept byte for byte: 600 x 300 stored (red left, blue right) with EXIF Orientation 6, shown by every
    # viewer as 300 x 600, red on top; "pil"/"numpy" gave it sideways, so the picture and its caption disagreed
    import io

    from PIL import Image

    stored = Image.new("RGB", (600, 300), (0, 0, 255))  # tests/operators/media/test_operators.py's phone photo
    stored.paste((255, 0, 0), (0, 0, 300, 300))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    rotated = io.BytesIO()
    stored.save(rotated, "JPEG", quality=95, exif=exif.tobytes())
    plain = io.BytesIO()
    Image.new("RGB", (40, 20), (0, 255, 0)).save(plain, "JPEG")
    path = _image_release(tmp_path, {"rotated": rotated.getvalue(), "plain": plain.getvalue()})
    samples = {s["sample_id"]: s for s in ReleaseDataset(path, decode=decode, shuffle=False)}
    images = {key: np.asarray(sample["image"]) for key, sample in samples.items()}
    assert images["rotated"].shape == (600, 300, 3) and images["plain"].shape == (20, 40, 3)
    top, bottom = images["rotated"][30, 150], images["rotated"][570, 150]
    assert top[0] > 200 and top[2] < 60 and bottom[2] > 200 and bottom[0] < 60, (top, bottom)
    if decode == "pil":
        assert all(sample["image"].mode == "RGB" for sample in samples.values())

"""Image-text samples out of the lake: WebDataset shards with KEY.jpg|png|webp + KEY.txt + KEY.json members,
read back by the ``webdataset`` library itself and by ``ReleaseDataset``, image bytes equal to the inputs."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from PIL import Image

from datahub.loader import ReleaseDataset
from tests.operators.media.conftest import IMAGES, image_of, shard_members


def _input_images() -> dict[str, bytes]:
    """sha256 -> bytes of every picture in the demo inputs (shard, Parquet, referenced files)."""
    import pyarrow.parquet as pq

    found = {}
    for members in shard_members().values():
        data = image_of(members) if any(e in members for e in ("jpg", "png", "webp")) else b""
        found[hashlib.sha256(data).hexdigest()] = data
    for data in pq.read_table(IMAGES / "pairs.parquet").column("image").to_pylist():
        found[hashlib.sha256(data).hexdigest()] = data
    for path in (IMAGES / "files").iterdir():
        found[hashlib.sha256(path.read_bytes()).hexdigest()] = path.read_bytes()
    return found


@pytest.fixture
def exported(image_demo_export):
    return image_demo_export


def test_shards_hold_standard_members_that_webdataset_reads(exported):
    import webdataset as wds

    lake, manifest, _, cfs = exported
    shards = sorted(str(p) for p in cfs.rglob("*.tar"))
    assert len(shards) == len(manifest.shards) >= 2
    inputs = _input_images()
    samples = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False))
    assert len(samples) == lake.read("samples").num_rows
    for sample in samples:
        images = [e for e in ("jpg", "png", "webp") if e in sample]
        assert len(images) == 1, sorted(sample)
        data = sample[images[0]]
        assert inputs[hashlib.sha256(data).hexdigest()] == data  # bytes equal to an input picture
        meta = json.loads(sample["json"])
        assert "image" not in meta and meta["image_sha256"] == hashlib.sha256(data).hexdigest()
        assert sample["txt"].decode() and meta["kind"] == "image_text"
    decoded = next(iter(wds.WebDataset(shards[:1], shardshuffle=False, empty_check=False).decode("pil")))
    assert isinstance(next(decoded[e] for e in ("jpg", "png", "webp") if e in decoded), Image.Image)


def test_release_dataset_gives_bytes_pil_and_numpy(exported):
    lake, manifest, storage, _ = exported
    kept = {r["sample_id"]: r for r in lake.read("samples", columns=["sample_id", "image", "text"]).to_pylist()}
    raw = list(ReleaseDataset(manifest, storage=storage, decode="bytes", shuffle=False, rank=0, world_size=1))
    assert {s["sample_id"] for s in raw} == set(kept)
    for sample in raw:
        image = next(sample[e] for e in ("jpg", "png", "webp") if e in sample)
        assert image == kept[sample["sample_id"]]["image"]
    pil = list(ReleaseDataset(manifest, storage=storage, decode="pil", shuffle=False, rank=0, world_size=1))
    arrays = list(ReleaseDataset(manifest, storage=storage, decode="numpy", shuffle=False, rank=0, world_size=1))
    for a, b in zip(pil, arrays):
        assert a["sample_id"] == b["sample_id"] and a["text"] == kept[a["sample_id"]]["text"]
        expected = Image.open(io.BytesIO(kept[a["sample_id"]]["image"])).convert("RGB")
        assert a["image"].size == expected.size
        assert b["image"].dtype == np.uint8 and b["image"].shape == (expected.height, expected.width, 3)
        assert np.array_equal(b["image"], np.asarray(expected))


def _image_size(sample):
    """A transform: the decoded PIL image replaced by its (width, height), the rest kept."""
    return {**sample, "image": sample["image"].size}


def test_transform_hook_and_exactly_once_resume_across_ranks(exported):
    """decode='pil' + transform on two ranks, stopped part-way and resumed from state_dict: every kept sample is
    read exactly once over the ranks, transformed, and the resumed stream is the rest of the uninterrupted one."""
    lake, manifest, storage, _ = exported
    kept = {r["sample_id"]: r for r in lake.read("samples", columns=["sample_id", "image"]).to_pylist()}
    opts = dict(storage=storage, decode="pil", transform=_image_size, seed=7, uneven="drop", world_size=2)
    seen: list[str] = []
    for rank in (0, 1):
        full = list(ReleaseDataset(manifest, rank=rank, **opts))
        first = ReleaseDataset(manifest, rank=rank, **opts)
        head = []
        for sample in first:
            head.append(sample)
            if len(head) == 3:
                break
        state = first.state_dict()
        resumed = ReleaseDataset(manifest, rank=rank, **opts)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert [s["sample_id"] for s in head + rest] == [s["sample_id"] for s in full]
        for sample in head + rest:
            with Image.open(io.BytesIO(kept[sample["sample_id"]]["image"])) as picture:
                assert sample["image"] == picture.size  # the transform ran on the decoded image
        seen += [s["sample_id"] for s in head + rest]
    assert len(seen) == len(set(seen))  # no sample twice across ranks
    assert len(kept) - len(seen) < 2  # uneven="drop": at most world_size - 1 left out
    assert set(seen) <= set(kept)

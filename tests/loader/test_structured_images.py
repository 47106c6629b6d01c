"""``decode="structured"`` on image-text samples: the image under the lake's column names (``image``, the encoded
bytes, and ``image_format``), whatever member extension the export gave it, so one loop over all kinds reads one key."""

from __future__ import annotations

import pytest

from datahub.loader import ReleaseDataset
from datahub.loader.decode import IMAGE_EXTENSIONS


@pytest.fixture
def exported(image_demo_export):
    lake, manifest, storage, _ = image_demo_export
    return lake, manifest, storage


def test_image_extensions_cover_what_the_export_writes():
    """decode.IMAGE_EXTENSIONS restates datahub.kinds.media.MEMBER_EXTENSIONS (importing datahub.kinds costs a
    trainer ~120 ms): a format the export learns must be learnt here too, or its image stays under its extension."""
    from datahub.kinds.media import MEMBER_EXTENSIONS
    from datahub.loader.decode import _FORMAT_OF_EXTENSION

    assert set(MEMBER_EXTENSIONS.values()) <= set(IMAGE_EXTENSIONS)
    for fmt, extension in MEMBER_EXTENSIONS.items():
        assert _FORMAT_OF_EXTENSION.get(extension, extension) == fmt


def test_structured_image_text_gives_image_and_image_format(exported):
    lake, manifest, storage = exported
    kept = {r["sample_id"]: r for r in
            lake.read("samples", columns=["sample_id", "image", "image_format", "text"]).to_pylist()}
    samples = list(ReleaseDataset(manifest, storage=storage, decode="structured", shuffle=False, rank=0, world_size=1))
    assert {s["sample_id"] for s in samples} == set(kept)
    formats = set()
    for sample in samples:
        row = kept[sample["sample_id"]]
        assert sample["kind"] == "image_text" and sample["text"] == row["text"]
        assert sample["image"] == row["image"], "the encoded file byte for byte, under the lake's column name"
        assert sample["image_format"] == row["image_format"]
        assert not [e for e in IMAGE_EXTENSIONS if e in sample], "no second key for the image by member extension"
        formats.add(sample["image_format"])
    assert len(formats) >= 2, f"the demo should hold more than one format (member extensions differ): {formats}"

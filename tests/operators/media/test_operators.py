"""image_verify, image_filter, image_resize, image_hash on Arrow batches of real pictures."""

from __future__ import annotations

import hashlib
import io

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from PIL import Image
from pydantic import ValidationError

from datahub.kinds.media import IMAGE_FIELDS
from datahub.operator import DROP_REASON, apply_batch_operator, build_operator
from operators.media.checks import inspect_image
from tests.operators.media.conftest import image_of


def rows(images: list[bytes], captions: list[str] | None = None) -> pa.Table:
    infos = []
    for data in images:
        try:
            infos.append(inspect_image(data, decode=False))
        except Exception:
            infos.append(None)
    columns = {
        "sample_id": [f"s{i:03d}" for i in range(len(images))],
        "text": captions or [f"caption number {i}" for i in range(len(images))],
        "image": pa.array(images, pa.binary()),
        "image_uri": pa.nulls(len(images), pa.string()),
        "image_format": [i.format if i else None for i in infos],
        "image_width": pa.array([i.width if i else None for i in infos], pa.int32()),
        "image_height": pa.array([i.height if i else None for i in infos], pa.int32()),
        "image_byte_size": pa.array([len(d) for d in images], pa.int64()),
        "image_sha256": [hashlib.sha256(d).hexdigest() for d in images],
    }
    return pa.table(columns, schema=pa.schema([pa.field("sample_id", pa.string()), pa.field("text", pa.string()),
                                               *IMAGE_FIELDS]))


@pytest.fixture(scope="module")
def pictures(demo_members, truth):
    good = [image_of(m) for k, m in sorted(demo_members.items()) if not truth[k]["reason"]]
    bad = {truth[k]["reason"]: (image_of(m) if any(e in m for e in ("jpg", "png")) else b"")
           for k, m in demo_members.items() if truth[k]["reason"]}
    return good, bad


def test_verify_drops_bad_media_with_reasons_and_fills_columns(pictures):
    good, bad = pictures
    table = rows(good[:3] + list(bad.values()))
    table = table.set_column(table.column_names.index("image_width"), "image_width", pa.nulls(table.num_rows, pa.int32()))
    out = apply_batch_operator(build_operator("image_verify", {}), table, node="verify")
    assert out.column(DROP_REASON).to_pylist() == [None] * 3 + list(bad)
    widths = out.column("image_width").to_pylist()[:3]
    assert widths == [Image.open(io.BytesIO(d)).width for d in good[:3]]


def test_filter_rules_and_signals(pictures):
    good, _ = pictures
    wide = Image.new("RGB", (400, 50), "blue")
    out = io.BytesIO()
    wide.save(out, "PNG")
    table = rows([good[0], out.getvalue(), good[1], good[2]], ["a fine caption", "a banner", "x", "another fine one"])
    op = build_operator("image_filter", {"min_width": 40, "max_aspect_ratio": 3.0, "min_caption_chars": 3})
    result = apply_batch_operator(op, table, node="filter")
    assert result.column(DROP_REASON).to_pylist() == [None, "image_aspect_ratio", "caption_length", None]
    assert result.column("quality").combine_chunks().field("image_aspect_ratio").to_pylist()[1] == pytest.approx(8.0)
    with pytest.raises(ValidationError, match="max_width"):
        build_operator("image_filter", {"min_width": 100, "max_width": 50})


def test_resize_shrinks_large_images_and_keeps_small_ones_byte_for_byte(pictures):
    good, _ = pictures
    big = io.BytesIO()
    Image.open(io.BytesIO(good[0])).convert("RGB").resize((600, 300)).save(big, "JPEG", quality=90)
    table = rows([big.getvalue(), good[1]])
    out = apply_batch_operator(build_operator("image_resize", {"max_side": 200}), table, node="resize")
    first, second = out.slice(0, 1).to_pylist()[0], out.slice(1, 1).to_pylist()[0]
    assert (first["image_width"], first["image_height"]) == (200, 100)
    assert Image.open(io.BytesIO(first["image"])).size == (200, 100)
    assert first["image_sha256"] == hashlib.sha256(first["image"]).hexdigest() != table.column("image_sha256")[0].as_py()
    assert second["image"] == good[1]  # within the limit: not re-encoded
    webp = apply_batch_operator(build_operator("image_resize", {"max_side": 4096, "format": "webp"}), table, node="r")
    assert set(webp.column("image_format").to_pylist()) == {"webp"}
    assert Image.open(io.BytesIO(webp.column("image")[1].as_py())).format == "WEBP"


def test_image_hash_annotates_64_bit_hashes(pictures):
    good, bad = pictures
    out = apply_batch_operator(build_operator("image_hash", {}), rows(good[:2] + [bad["unknown_image_format"]]), node="h")
    hashes = out.column("quality").combine_chunks().field("image_phash")
    assert hashes.type == pa.int64() and hashes.null_count == 1 and pc.all(pc.is_valid(hashes.slice(0, 2))).as_py()


def _exif_rotated_jpeg() -> bytes:
    """A phone-style JPEG: 600 x 300 stored pixels (left half red, right half blue) with EXIF Orientation 6
    ('rotate 90 degrees clockwise to display'), so it shows as 300 x 600, red on top."""
    stored = Image.new("RGB", (600, 300), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 300, 300))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    out = io.BytesIO()
    stored.save(out, "JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def test_resize_keeps_an_exif_rotated_photo_upright():
    """Re-encoding dropped the EXIF Orientation tag without applying it: a portrait phone photo came out sideways
    (200 x 100, red on the left) while every viewer showed the original upright (300 x 600, red on top)."""
    from PIL import ImageOps

    data = _exif_rotated_jpeg()
    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == (300, 600)
    out = apply_batch_operator(build_operator("image_resize", {"max_side": 200}), rows([data]), node="resize")
    row = out.to_pylist()[0]
    shown = ImageOps.exif_transpose(Image.open(io.BytesIO(row["image"]))).convert("RGB")
    assert shown.size == (100, 200) == (row["image_width"], row["image_height"])
    top, bottom = shown.getpixel((50, 30)), shown.getpixel((50, 170))
    assert top[0] > 200 and top[2] < 60 and bottom[2] > 200 and bottom[0] < 60, (top, bottom)

"""The image_text kind: typed columns, documented sample_id, export members by image format."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import xxhash

from datahub.kinds import kind_spec, row_fields
from datahub.kinds.media import image_members, image_text_sample_ids


def _table(captions, images, formats):
    return pa.table({"text": captions, "image": pa.array(images, pa.binary()), "image_format": formats,
                     "image_sha256": [hashlib.sha256(i).hexdigest() if i is not None else None for i in images]})


def test_fields_are_typed_arrow_columns():
    fields = {f.name: f.type for f in row_fields(["text", "image_text"])}
    assert fields["kind"] == pa.string() and fields["image"] == pa.binary()
    assert fields["image_width"] == pa.int32() and fields["image_byte_size"] == pa.int64()
    assert kind_spec("image_text").member_columns == ("image",)


def test_sample_id_is_caption_plus_image_hash_as_documented():
    table = _table(["a cat\r\n", "a cat", "a dog", "a cat"], [b"x", b"x", b"x", b"y"], ["png"] * 4)
    ids = image_text_sample_ids(table).to_pylist()
    assert ids[0] == ids[1]  # identity normalization of the caption (newlines, trailing whitespace)
    assert len(set(ids[1:])) == 3  # another caption or another image: another id
    expected = xxhash.xxh3_128_hexdigest(b"a cat\x00" + hashlib.sha256(b"x").hexdigest().encode())
    assert ids[1] == expected
    assert kind_spec("image_text").sample_ids(table).to_pylist() == ids


def test_members_are_named_by_format():
    table = _table(["a", "b", "c"], [b"J", b"P", None], ["jpeg", "png", None])
    members = image_members(table)
    assert members["jpg"].to_pylist() == [b"J", None, None]
    assert members["png"].to_pylist() == [None, b"P", None]
    assert list(members) == ["jpg", "png", "webp", "gif", "bmp", "tiff"]  # the same members for every batch
    assert members["webp"].null_count == 3

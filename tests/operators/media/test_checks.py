"""Media checks with Pillow: every kind of bad file gets its own reason; good ones their format, size, checksum."""

from __future__ import annotations

import hashlib

import pytest
from PIL import Image

from operators.media.checks import MediaProblem, inspect_image
from tests.operators.media.conftest import encode_png, image_of


def test_good_images_give_format_size_and_checksum(demo_members, truth):
    seen = set()
    for key, members in demo_members.items():
        if truth[key]["reason"]:
            continue
        data = image_of(members)
        info = inspect_image(data)
        with Image.open(__import__("io").BytesIO(data)) as image:
            assert (info.width, info.height) == image.size
        assert info.sha256 == hashlib.sha256(data).hexdigest() and info.byte_size == len(data)
        seen.add(info.format)
    assert seen == {"jpeg", "png", "webp"}


def test_each_corrupt_file_has_its_reason(demo_members, truth):
    bad = {k: v for k, v in truth.items() if v["reason"] and k in demo_members}
    assert len(bad) == 4
    for key, expected in bad.items():
        with pytest.raises(MediaProblem) as caught:
            inspect_image(image_of(demo_members[key]) if any(e in demo_members[key] for e in ("jpg", "png"))
                          else b"")
        assert caught.value.reason == expected["reason"], (key, caught.value)


def test_header_only_check_misses_truncation_that_decoding_finds(demo_members):
    data = demo_members["bad-truncated"]["jpg"]
    assert inspect_image(data, decode=False).format == "jpeg"
    with pytest.raises(MediaProblem, match="undecodable_image"):
        inspect_image(data)


def test_pixel_limit_and_allowed_formats_are_params():
    data = encode_png(Image.new("RGB", (100, 100), "red"))
    with pytest.raises(MediaProblem) as caught:
        inspect_image(data, max_pixels=9_999)
    assert caught.value.reason == "decompression_bomb" and "max_pixels=9,999" in caught.value.detail
    with pytest.raises(MediaProblem) as caught:
        inspect_image(data, formats=("jpeg",))
    assert caught.value.reason == "unsupported_image_format"

"""Batched perceptual hashes: imagehash's definitions, bit for bit where the decode is the same."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from operators.media.dedup import band_keys_of
from operators.media.hashing import hamming, perceptual_hashes
from tests.operators.media.conftest import image_of

imagehash = pytest.importorskip("imagehash")


def _good_images(demo_members, truth) -> list[bytes]:
    return [image_of(m) for k, m in sorted(demo_members.items()) if not truth[k]["reason"]]


@pytest.mark.parametrize("kind", ["phash", "dhash"])
def test_hashes_match_imagehash(demo_members, truth, kind):
    images = _good_images(demo_members, truth)
    hashes, ok = perceptual_hashes(images, kind, threads=2)
    assert ok.all()
    peer = getattr(imagehash, kind)
    reference = np.array([int(str(peer(Image.open(io.BytesIO(d)))), 16) for d in images], dtype=np.uint64)
    distance = hamming(hashes, reference)
    is_jpeg = np.array([d[:2] == b"\xff\xd8" for d in images])
    opaque = np.array([Image.open(io.BytesIO(d)).mode in ("RGB", "L") for d in images])
    # pHash of PNG/WebP: the same pixels as imagehash's (these pictures are at most 6x its 32 px grid, under the
    # box-reduce gap); JPEGs decode at reduced scale (Image.draft), and dHash's 9 px grid is box-reduced first
    # (reducing_gap): a few bits may differ there
    if kind == "phash":
        assert (distance[~is_jpeg & opaque] == 0).all(), distance[~is_jpeg & opaque]
    assert np.median(distance[opaque]) <= 1 and distance[opaque].max() <= 8, distance[opaque]
    # transparent pictures differ on purpose: composited on white here, alpha dropped by imagehash


def test_undecodable_images_have_no_hash():
    hashes, ok = perceptual_hashes([b"", b"not an image", None], "phash")
    assert not ok.any() and (hashes == 0).all()


def test_hamming_is_popcount_of_xor():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2**63, 500, dtype=np.int64), rng.integers(0, 2**63, 500, dtype=np.int64)
    expected = [bin(int(x) ^ int(y)).count("1") for x, y in zip(a, b)]
    assert hamming(a, b).tolist() == expected


@pytest.mark.parametrize("distance", [0, 3, 10])
def test_pairs_within_the_distance_always_share_a_band_key(distance):
    """Pigeonhole: max_distance + 1 bands, so every pair within the distance is a candidate."""
    rng = random.Random(distance)
    for _ in range(300):
        h = rng.getrandbits(64)
        flipped = h
        for bit in rng.sample(range(64), distance):
            flipped ^= 1 << bit
        pair = np.array([h, flipped], dtype=np.uint64)
        keys = band_keys_of(pair, distance + 1)
        assert set(keys[0]) & set(keys[1])

"""Batched perceptual hashes: imagehash's definitions, bit for bit where the thumbnail is the same, close elsewhere."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from operators.media.dedup import band_keys_of
from operators.media.hashing import THUMBNAILS, hamming, perceptual_hashes, thumbnail
from tests.operators.media.conftest import image_of

imagehash = pytest.importorskip("imagehash")


def _good_images(demo_members, truth) -> list[bytes]:
    return [image_of(m) for k, m in sorted(demo_members.items()) if not truth[k]["reason"]]


def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _imagehash(images: list[bytes], kind: str) -> np.ndarray:
    peer = getattr(imagehash, kind)
    return np.array([int(str(peer(Image.open(io.BytesIO(d)))), 16) for d in images], dtype=np.uint64)


@pytest.mark.parametrize("kind", ["phash", "dhash"])
def test_hashes_are_close_to_imagehash(demo_members, truth, kind):
    images = _good_images(demo_members, truth)
    hashes, ok = perceptual_hashes(images, kind, threads=2)
    assert ok.all()
    distance = hamming(hashes, _imagehash(images, kind))
    opaque = np.array([Image.open(io.BytesIO(d)).mode in ("RGB", "L") for d in images])
    # JPEGs decode at reduced scale (Image.draft) and larger pictures are box-reduced first (reducing_gap): the
    # thumbnail is another low-pass of the same picture, so a few bits near the threshold may differ
    assert np.median(distance[opaque]) <= 1 and distance[opaque].max() <= 8, distance[opaque]
    # transparent pictures differ on purpose: composited on white here, alpha dropped by imagehash


@pytest.mark.parametrize("kind", ["phash", "dhash"])
def test_hashes_equal_imagehash_where_the_thumbnail_is_imagehash_s(demo_members, truth, kind):
    """PNGs at most 2x the pHash grid: no reduced-scale decode, no box reduction, the same Lanczos pixels."""
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in _good_images(demo_members, truth)]
    small = [_encode(p.resize((60, 60), Image.Resampling.LANCZOS), "PNG") for p in pictures]
    hashes, ok = perceptual_hashes(small, kind, threads=2)
    assert ok.all()
    assert (hashes == _imagehash(small, kind)).all()


def test_large_jpegs_decoded_at_reduced_scale_stay_close_to_imagehash(demo_members, truth):
    """512 px JPEGs decode at 1/8 scale for pHash (64 px): a few bits from imagehash's full-size Lanczos."""
    pictures = [Image.open(io.BytesIO(d)).convert("RGB") for d in _good_images(demo_members, truth)]
    large = [_encode(p.resize((512, max(1, 512 * p.height // p.width)), Image.Resampling.LANCZOS), "JPEG", quality=90)
             for p in pictures]
    distance = hamming(perceptual_hashes(large, "phash", threads=2)[0], _imagehash(large, "phash"))
    assert np.median(distance) <= 1 and distance.max() <= 8, distance


def test_batch_dct_is_scipy_s_dct_of_each_thumbnail(demo_members, truth):
    """The batched matrix-product DCT (in blocks of 256) gives each thumbnail's scipy DCT-II, median threshold."""
    fftpack = pytest.importorskip("scipy.fftpack")
    images = _good_images(demo_members, truth) * 8  # > 256: crosses a DCT block
    hashes, ok = perceptual_hashes(images, "phash", threads=2)
    assert ok.all()
    expected = []
    for data in images:
        pixels = thumbnail(data, THUMBNAILS["phash"])
        assert pixels is not None
        low = fftpack.dct(fftpack.dct(pixels.astype(float), axis=0), axis=1)[:8, :8]
        expected.append(int("".join("1" if bit else "0" for bit in (low > np.median(low)).ravel()), 2))
    assert hashes.tolist() == expected


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

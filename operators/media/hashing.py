"""64-bit perceptual image hashes (pHash, dHash), computed for a batch at once.

The definitions follow imagehash's (github.com/JohannesBuchner/imagehash, after N. Krawetz, "Looks like it" and
"Kind of like that", hackerfactor.com 2011/2013):

- pHash: greyscale, resized to 32 x 32 (Lanczos), 2-D DCT-II, the 8 x 8 lowest frequencies, bit = coefficient >
  their median;
- dHash: greyscale, resized to 9 x 8, bit = pixel > its left neighbour.

Bits are packed row-major, first bit most significant, so ``f"{h:016x}"`` is imagehash's ``str(hash)``.

What makes it fast (``benchmarks/image_dedup.py`` measures it against imagehash called per image): JPEGs are
decoded at a reduced scale (``Image.draft``: libjpeg's DCT scaling skips most of the inverse DCT and the colour
conversion), larger pictures are box-reduced before the Lanczos step (``reducing_gap``), ``Image.open`` is told
the format the leading bytes name, images are decoded on a thread pool (Pillow releases the GIL in its decoders
and resamplers: it helps where cores are idle), and the DCT of the batch is matrix products in numpy.

So the thumbnails are not imagehash's pixel for pixel, and a hash may differ from imagehash's by a few bits
(tests/operators/media bound it; the benchmark prints the share of equal hashes): pHash decodes JPEGs at the
32 px grid itself (1/8 scale: 8 x 8 block means, all its 8 x 8 lowest frequencies need) and box-reduces to 2x the
grid; dHash, which compares neighbouring pixels of its 9 x 8 grid and so reacts to any change of low-pass filter,
decodes JPEGs at >= 128 px and box-reduces to 6x the grid only. Transparent pixels are composited on white (as a
viewer shows them; imagehash drops the alpha channel, so every transparent icon hashes alike). The definition
is this module's, the same on every engine and run: a change to it changes stored hashes (``image_index``), so
it goes with a new version of the operators that store them (``image_dedup``, ``image_hash``).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, NamedTuple

import numpy as np
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

HashKind = Literal["phash", "dhash"]
HASH_BITS = 64
_PHASH_SIDE = 32  # imagehash: hash_size 8 x highfreq_factor 4


class Thumbnail(NamedTuple):
    """How the greyscale thumbnail a hash is computed from is made."""

    size: tuple[int, int]  # (width, height)
    draft_side: int  # JPEGs decode at a reduced scale (1/2, 1/4, 1/8) no smaller than this a side
    reducing_gap: float  # Pillow: box-reduce to this many times the size, then Lanczos


# Measured on the benchmark corpus (2,000 images) and data/images: pHash at 32 px / gap 2 vs 128 px / gap 6 costs
# ~0.3 ms less an image (1/8-scale decode; Lanczos from 256 px is ~0.33 ms, from 64 px ~0.07 ms) with the same
# recall and no wrong pair; dHash with gap 2 differed from imagehash by up to 26 bits, so it keeps 128 px / gap 6.
THUMBNAILS: dict[HashKind, Thumbnail] = {"phash": Thumbnail((_PHASH_SIDE, _PHASH_SIDE), _PHASH_SIDE, 2.0),
                                         "dhash": Thumbnail((9, 8), 128, 6.0)}
# Leading bytes of the usual formats: Image.open then asks that one plugin instead of trying the registered ones
# in turn (a WebP file met ~7 plugins first, ~0.1-0.2 ms an image)
_MAGIC: tuple[tuple[int, bytes, str], ...] = ((0, b"\xff\xd8\xff", "JPEG"), (0, b"\x89PNG\r\n\x1a\n", "PNG"),
                                             (8, b"WEBP", "WEBP"), (0, b"GIF8", "GIF"))


def _dct_matrix(n: int, keep: int) -> np.ndarray:
    """The first ``keep`` rows of the unnormalized DCT-II of size ``n`` (scipy.fftpack.dct's default)."""
    k = np.arange(keep)[:, None]
    m = np.arange(n)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * m + 1) / (2 * n))


_DCT = _dct_matrix(_PHASH_SIDE, 8)
_DCT_T = np.ascontiguousarray(_DCT.T)
_DCT_BLOCK = 256  # thumbnails per DCT block


def _formats(data: bytes) -> tuple[str, ...] | None:
    """The Pillow format named by the leading bytes, or None (then every plugin is tried)."""
    for offset, magic, name in _MAGIC:
        if data.startswith(magic, offset):
            return (name,)
    return None


def thumbnail(data: bytes, recipe: Thumbnail) -> np.ndarray | None:
    """The greyscale thumbnail of encoded ``data`` as uint8 (rows, cols), or None if it does not decode.

    Callers silence ``Image.DecompressionBombWarning`` (``thumbnails`` does, once per batch: the filter is
    process-wide, so setting it per image from pool threads would race)."""
    size = recipe.size
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=_formats(data))
        if isinstance(image, JpegImageFile):
            image.draft("L", (max(size[0], recipe.draft_side), max(size[1], recipe.draft_side)))
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        grey = image if image.mode == "L" else image.convert("L")
        small = grey.resize(size, Image.Resampling.LANCZOS, reducing_gap=recipe.reducing_gap)
        return np.frombuffer(small.tobytes(), dtype=np.uint8).reshape(size[1], size[0])
    except Exception:  # undecodable media has no hash; image_verify / the readers give the reason
        return None


def thumbnails(images: Sequence[bytes | None], recipe: Thumbnail, *,
               threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels (n, rows, cols) uint8, ok (n,) bool)`` for a batch, decoded in parallel."""
    n = len(images)
    pixels = np.zeros((n, recipe.size[1], recipe.size[0]), dtype=np.uint8)
    ok = np.zeros(n, dtype=bool)
    workers = threads if threads is not None else min(8, os.cpu_count() or 1)

    def one(i: int) -> None:
        data = images[i]
        if data:
            thumb = thumbnail(data, recipe)
            if thumb is not None:
                pixels[i] = thumb
                ok[i] = True

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        if workers <= 1 or n < 4:
            for i in range(n):
                one(i)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(one, range(n), chunksize=max(1, n // (workers * 4))))
    return pixels, ok


def _pack(bits: np.ndarray) -> np.ndarray:
    """(n, 64) bool -> (n,) uint64, first bit most significant."""
    return np.packbits(bits.reshape(len(bits), HASH_BITS), axis=1).view(">u8").ravel().astype(np.uint64)


def phash_pixels(pixels: np.ndarray) -> np.ndarray:
    """pHash of (n, 32, 32) greyscale thumbnails: DCT-II of the batch as ``D @ X @ D.T``, median threshold."""
    low = np.empty((len(pixels), 8, 8))
    # in blocks: the float64 copy of a block stays in cache (one copy of a whole batch cost 10x the products)
    for start in range(0, len(pixels), _DCT_BLOCK):
        low[start:start + _DCT_BLOCK] = _DCT @ pixels[start:start + _DCT_BLOCK].astype(np.float64) @ _DCT_T
    flat = low.reshape(len(low), HASH_BITS)
    median = np.median(flat, axis=1, keepdims=True)
    return _pack(flat > median)


def dhash_pixels(pixels: np.ndarray) -> np.ndarray:
    """dHash of (n, 8, 9) greyscale thumbnails: each pixel brighter than its left neighbour."""
    return _pack(pixels[:, :, 1:] > pixels[:, :, :-1])


def perceptual_hashes(images: Sequence[bytes | None], kind: HashKind = "phash", *,
                      threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes (n,) uint64, ok (n,) bool)``: the 64-bit hash of each encoded image (0 where not ok)."""
    pixels, ok = thumbnails(images, THUMBNAILS[kind], threads=threads)
    if not len(images):
        return np.zeros(0, np.uint64), ok
    hashes = phash_pixels(pixels) if kind == "phash" else dhash_pixels(pixels)
    hashes[~ok] = 0
    return hashes, ok


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bitwise Hamming distance of two uint64/int64 arrays, elementwise."""
    return np.bitwise_count(np.bitwise_xor(a.view(np.uint64), b.view(np.uint64))).astype(np.int64)


def to_signed(hashes: np.ndarray) -> np.ndarray:
    """uint64 -> int64 of the same bits (Arrow, Delta and Spark have no unsigned 64-bit integers)."""
    return hashes.astype(np.uint64).view(np.int64)

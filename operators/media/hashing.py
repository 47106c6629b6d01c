"""64-bit perceptual image hashes (pHash, dHash), computed for a batch at once.

The definitions are imagehash's (github.com/JohannesBuchner/imagehash, after N. Krawetz, "Looks like it" and
"Kind of like that", hackerfactor.com 2011/2013):

- pHash: greyscale, resized to 32 x 32 (Lanczos), 2-D DCT-II, the 8 x 8 lowest frequencies, bit = coefficient >
  their median;
- dHash: greyscale, resized to 9 x 8, bit = pixel > its left neighbour.

Bits are packed row-major, first bit most significant, so ``f"{h:016x}"`` is imagehash's ``str(hash)``.

What makes it fast (``benchmarks/image_dedup.py`` measures it against imagehash called per image): images are
decoded and shrunk by a thread pool (Pillow releases the GIL in its decoders and resamplers), JPEGs are decoded
at a reduced scale (``Image.draft``, DCT scaling in libjpeg) no smaller than 128 px a side, large pictures are
reduced by a box filter to 6x the grid before the Lanczos step (``reducing_gap``), and the DCT of the whole batch is two matrix
products in numpy. Two differences from imagehash, both deliberate: transparent pixels are composited on white
(as a viewer shows them; imagehash drops the alpha channel, so every transparent icon hashes alike), and the
reduced-scale decode and the box reduction may flip a bit or two near the threshold (tests/operators/media).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

HashKind = Literal["phash", "dhash"]
HASH_BITS = 64
_PHASH_SIDE = 32  # imagehash: hash_size 8 x highfreq_factor 4
_DRAFT_SIDE = 128  # decode JPEGs at no less than this many pixels a side (libjpeg scales by 1/2, 1/4, 1/8)
_REDUCING_GAP = 6.0  # Pillow: box-reduce to 6x the target, then Lanczos (exact Lanczos below that)


def _dct_matrix(n: int, keep: int) -> np.ndarray:
    """The first ``keep`` rows of the unnormalized DCT-II of size ``n`` (scipy.fftpack.dct's default)."""
    k = np.arange(keep)[:, None]
    m = np.arange(n)[None, :]
    return 2.0 * np.cos(np.pi * k * (2 * m + 1) / (2 * n))


_DCT = _dct_matrix(_PHASH_SIDE, 8)
_DCT_T = np.ascontiguousarray(_DCT.T)


def _grid(kind: HashKind) -> tuple[int, int]:
    """(width, height) of the greyscale thumbnail a hash is computed from."""
    return (_PHASH_SIDE, _PHASH_SIDE) if kind == "phash" else (9, 8)


def thumbnail(data: bytes, size: tuple[int, int]) -> np.ndarray | None:
    """The greyscale ``size`` thumbnail of encoded ``data`` as uint8 (rows, cols), or None if it does not decode."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            if isinstance(image, JpegImageFile):
                image.draft("L", (max(size[0], _DRAFT_SIDE), max(size[1], _DRAFT_SIDE)))
            if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
                rgba = image.convert("RGBA")
                image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
            grey = image.convert("L")
            small = grey.resize(size, Image.Resampling.LANCZOS, reducing_gap=_REDUCING_GAP)
            return np.asarray(small, dtype=np.uint8)
    except Exception:  # undecodable media has no hash; image_verify / the readers give the reason
        return None


def thumbnails(images: Sequence[bytes | None], size: tuple[int, int], *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels (n, rows, cols) uint8, ok (n,) bool)`` for a batch, decoded in parallel."""
    n = len(images)
    pixels = np.zeros((n, size[1], size[0]), dtype=np.uint8)
    ok = np.zeros(n, dtype=bool)
    workers = threads if threads is not None else min(8, os.cpu_count() or 1)

    def one(i: int) -> None:
        data = images[i]
        if data:
            thumb = thumbnail(data, size)
            if thumb is not None:
                pixels[i] = thumb
                ok[i] = True

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
    low = _DCT @ pixels.astype(np.float64) @ _DCT_T  # (n, 8, 8)
    flat = low.reshape(len(low), HASH_BITS)
    median = np.median(flat, axis=1, keepdims=True)
    return _pack(flat > median)


def dhash_pixels(pixels: np.ndarray) -> np.ndarray:
    """dHash of (n, 8, 9) greyscale thumbnails: each pixel brighter than its left neighbour."""
    return _pack(pixels[:, :, 1:] > pixels[:, :, :-1])


def perceptual_hashes(images: Sequence[bytes | None], kind: HashKind = "phash", *,
                      threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes (n,) uint64, ok (n,) bool)``: the 64-bit hash of each encoded image (0 where not ok)."""
    pixels, ok = thumbnails(images, _grid(kind), threads=threads)
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

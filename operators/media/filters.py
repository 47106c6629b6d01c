"""Image operators on ``image_text`` rows: verify, filter by size/shape/caption, resize, perceptual hash.

All are batch operators (Arrow in, Arrow out, every engine). Columns are ``datahub.kinds.media``'s.
"""

from __future__ import annotations

import hashlib
import io
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageOps
from PIL.JpegImagePlugin import JpegImageFile
from pydantic import Field, model_validator

from datahub.kinds.media import (IMAGE, IMAGE_BYTE_SIZE, IMAGE_FORMAT, IMAGE_HEIGHT, IMAGE_SHA256, IMAGE_WIDTH)
from datahub.operator import BatchOperator, Params, add_quality_signals, register
from operators.media.checks import DEFAULT_FORMATS, DEFAULT_MAX_PIXELS, MediaProblem, inspect_image
from operators.media.hashing import HashKind, perceptual_hashes, to_signed

EXIF_ORIENTATION = 0x0112  # EXIF tag 274: how a viewer rotates/flips the stored pixels (1: as stored)

IMAGE_KINDS = frozenset({"image_text"})


def _set(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, values)
    return table.append_column(name, values)


class VerifyParams(Params):
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1, description="more pixels than this: decompression_bomb")
    formats: tuple[str, ...] = Field(DEFAULT_FORMATS, description="allowed formats (Pillow names, lowercase)")
    decode: bool = Field(True, description="decode the whole image (finds truncated files), not only the header")


@register
class ImageVerify(BatchOperator[VerifyParams]):
    """Check every image with Pillow and (re)fill format, width, height, byte size and SHA-256 from its bytes.

    Bad media is dropped with the reason of ``operators.media.checks`` (the readers quarantine the same
    reasons at ingest; this catches rows that came in another way, or a stricter limit set later).
    """

    name = "image_verify"
    version = "1"
    Params = VerifyParams
    kinds = IMAGE_KINDS

    def process(self, table: pa.Table) -> pa.Table:
        p = self.params
        images = table.column(IMAGE).to_pylist()
        n = len(images)
        formats: list[str | None] = [None] * n
        widths: list[int | None] = [None] * n
        heights: list[int | None] = [None] * n
        sizes: list[int | None] = [None] * n
        digests: list[str | None] = [None] * n
        reasons: list[str | None] = [None] * n
        for i, data in enumerate(images):
            try:
                info = inspect_image(data, max_pixels=p.max_pixels, formats=p.formats, decode=p.decode)
            except MediaProblem as problem:
                reasons[i] = problem.reason
                continue
            formats[i], widths[i], heights[i], sizes[i], digests[i] = (info.format, info.width, info.height,
                                                                       info.byte_size, info.sha256)
        bad = pa.array([r is not None for r in reasons])
        for name, values, kind in ((IMAGE_FORMAT, formats, pa.string()), (IMAGE_WIDTH, widths, pa.int32()),
                                   (IMAGE_HEIGHT, heights, pa.int32()), (IMAGE_BYTE_SIZE, sizes, pa.int64()),
                                   (IMAGE_SHA256, digests, pa.string())):
            old = table.column(name) if name in table.column_names else pa.nulls(n, kind)
            table = _set(table, name, pc.if_else(bad, pc.cast(old, kind), pa.array(values, kind)))
        return self.mark_dropped(table, bad, pa.array(reasons, pa.string()))


class ImageFilterParams(Params):
    min_width: int = Field(0, ge=0)
    min_height: int = Field(0, ge=0)
    max_width: int | None = Field(None, ge=1)
    max_height: int | None = Field(None, ge=1)
    # Aspect = long side / short side; 3.0 drops banners and strips (DataComp's basic filter uses 3.0).
    max_aspect_ratio: float | None = Field(None, ge=1.0)
    min_bytes: int = Field(0, ge=0)
    max_bytes: int | None = Field(None, ge=1)
    min_caption_chars: int = Field(0, ge=0)
    max_caption_chars: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _ranges(self) -> ImageFilterParams:
        for low, high in (("min_width", "max_width"), ("min_height", "max_height"), ("min_bytes", "max_bytes"),
                          ("min_caption_chars", "max_caption_chars")):
            top = getattr(self, high)
            if top is not None and top < getattr(self, low):
                raise ValueError(f"{high}={top} is below {low}={getattr(self, low)}")
        return self


@register
class ImageFilter(BatchOperator[ImageFilterParams]):
    """Drop images too small, too large, too elongated, too few/many bytes, or with too short/long a caption.

    Adds ``quality.image_aspect_ratio`` (long side / short side) and ``quality.caption_chars`` to every row; the
    first failing rule names the drop reason (``image_too_small``, ``image_too_large``, ``image_aspect_ratio``,
    ``image_bytes``, ``caption_length``).
    """

    name = "image_filter"
    version = "1"
    Params = ImageFilterParams
    kinds = IMAGE_KINDS
    annotates = True

    def process(self, table: pa.Table) -> pa.Table:
        p = self.params
        width = pc.cast(pc.fill_null(table.column(IMAGE_WIDTH), 0), pa.float64())
        height = pc.cast(pc.fill_null(table.column(IMAGE_HEIGHT), 0), pa.float64())
        size = pc.fill_null(table.column(IMAGE_BYTE_SIZE), 0)
        chars = pc.fill_null(pc.utf8_length(table.column("text")), 0)
        long_side, short_side = pc.max_element_wise(width, height), pc.min_element_wise(width, height)
        aspect = pc.if_else(pc.greater(short_side, 0), pc.divide(long_side, pc.max_element_wise(short_side, 1.0)),
                            pa.scalar(None, pa.float64()))
        table = add_quality_signals(table, {"image_aspect_ratio": aspect, "caption_chars": pc.cast(chars, pa.int64())})
        rules: list[tuple[str, pa.Array | pa.ChunkedArray]] = [
            ("image_too_small", pc.or_(pc.less(width, p.min_width), pc.less(height, p.min_height))),
        ]
        if p.max_width is not None or p.max_height is not None:
            rules.append(("image_too_large", pc.or_(pc.greater(width, p.max_width or np.inf),
                                                    pc.greater(height, p.max_height or np.inf))))
        if p.max_aspect_ratio is not None:
            rules.append(("image_aspect_ratio", pc.fill_null(pc.greater(aspect, p.max_aspect_ratio), True)))
        rules.append(("image_bytes", pc.or_(pc.less(size, p.min_bytes), pc.greater(size, p.max_bytes or np.iinfo(np.int64).max))))
        rules.append(("caption_length", pc.or_(pc.less(chars, p.min_caption_chars),
                                               pc.greater(chars, p.max_caption_chars or np.iinfo(np.int64).max))))
        for reason, mask in rules:
            table = self.mark_dropped(table, mask, reason)
        return table


class ResizeParams(Params):
    max_side: int = Field(1024, ge=8, description="longer side above this: shrink to it (aspect kept, Lanczos)")
    format: str | None = Field(None, description="re-encode as this format (jpeg, png, webp); default: keep the format")
    quality: int = Field(90, ge=1, le=100, description="JPEG/WebP quality of re-encoded images")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, ge=1, description="never decode more pixels than this")


@register
class ImageResize(BatchOperator[ResizeParams]):
    """Shrink images whose longer side exceeds ``max_side`` (and/or re-encode to ``format``); the others keep
    their bytes. A re-encoded image has its EXIF orientation applied (the new bytes carry no EXIF), so a phone
    photo stays upright. Width, height, byte size and SHA-256 follow the new bytes; ``sample_id`` stays (it names
    the sample as ingested, and lineage records the change)."""

    name = "image_resize"
    version = "2"  # 2: EXIF orientation applied before re-encoding
    Params = ResizeParams
    kinds = IMAGE_KINDS

    def process(self, table: pa.Table) -> pa.Table:
        p = self.params
        images = table.column(IMAGE).to_pylist()
        columns = {name: table.column(name).to_pylist() for name in (IMAGE_FORMAT, IMAGE_WIDTH, IMAGE_HEIGHT,
                                                                     IMAGE_BYTE_SIZE, IMAGE_SHA256)}
        reasons: list[str | None] = [None] * len(images)
        target = (p.format or "").lower() or None
        for i, data in enumerate(images):
            width, height, fmt = columns[IMAGE_WIDTH][i], columns[IMAGE_HEIGHT][i], columns[IMAGE_FORMAT][i]
            if data is None or width is None or height is None:
                continue
            if max(width, height) <= p.max_side and (target is None or target == fmt):
                continue
            if width * height > p.max_pixels:
                reasons[i] = "decompression_bomb"
                continue
            try:
                encoded, new_size, new_format = self._resize(data, target or fmt or "png")
            except Exception:
                reasons[i] = "undecodable_image"
                continue
            images[i] = encoded
            columns[IMAGE_WIDTH][i], columns[IMAGE_HEIGHT][i] = new_size
            columns[IMAGE_FORMAT][i] = new_format
            columns[IMAGE_BYTE_SIZE][i] = len(encoded)
            columns[IMAGE_SHA256][i] = hashlib.sha256(encoded).hexdigest()
        table = _set(table, IMAGE, pa.array(images, pa.binary()))
        for name, values in columns.items():
            table = _set(table, name, pa.array(values, table.schema.field(name).type))
        return self.mark_dropped(table, pa.array([r is not None for r in reasons]), pa.array(reasons, pa.string()))

    def _resize(self, data: bytes, fmt: str) -> tuple[bytes, tuple[int, int], str]:
        p = self.params
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image: Image.Image = Image.open(io.BytesIO(data))
            if max(image.size) > p.max_side and isinstance(image, JpegImageFile):
                image.draft(image.mode, (p.max_side, p.max_side))
            if image.getexif().get(EXIF_ORIENTATION, 1) != 1:
                # the new bytes carry no EXIF: apply the rotation/flip viewers apply, or the photo comes out sideways
                image = ImageOps.exif_transpose(image)
            if max(image.size) > p.max_side:
                scale = p.max_side / max(image.size)
                size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
                image = image.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
            out = io.BytesIO()
            if fmt == "jpeg":
                image.convert("RGB").save(out, "JPEG", quality=p.quality)
            elif fmt == "webp":
                image.save(out, "WEBP", quality=p.quality)
            else:
                image.save(out, fmt.upper())
            return out.getvalue(), image.size, fmt


class HashParams(Params):
    hash: HashKind = "phash"
    threads: int | None = Field(None, ge=1, description="decode threads (default: the CPU count, at most 8)")


PERCEPTUAL_HASH = "image_phash"


@register
class ImageHash(BatchOperator[HashParams]):
    """Annotate ``quality.image_<hash>`` (int64 bits of the 64-bit perceptual hash; null if undecodable)."""

    name = "image_hash"
    version = "2"  # 2: pHash thumbnails from a 1/8-scale JPEG decode and a 2x box-reduce gap (operators.media.hashing)
    Params = HashParams
    kinds = IMAGE_KINDS
    annotates = True

    def process(self, table: pa.Table) -> pa.Table:
        hashes, ok = perceptual_hashes(table.column(IMAGE).to_pylist(), self.params.hash, threads=self.params.threads)
        values = pa.array(to_signed(hashes), pa.int64(), mask=~ok)
        return add_quality_signals(table, {f"image_{self.params.hash}": values})

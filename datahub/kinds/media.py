"""The ``image_text`` kind: one image with its caption (a LAION / img2dataset pair).

Columns (all nullable; null on rows of other kinds):

- ``image`` (binary): the encoded file as it came in (JPEG, PNG, WebP, ...), byte for byte;
- ``image_uri`` (string): where the image came from (a path or ``s3://`` URI), or, for media too large to hold
  inline, the reference to read it from (then ``image`` is null and ``image_sha256`` checks what is read);
- ``image_format`` (string): Pillow's format name, lowercased (``jpeg``, ``png``, ``webp``, ...);
- ``image_width``, ``image_height`` (int32): pixels, from the header;
- ``image_byte_size`` (int64): length of the encoded file;
- ``image_sha256`` (string): hex SHA-256 of the encoded file.

``text`` is the caption: what text operators (length, language, MinHash) see.

``sample_id`` = lowercase hex of xxh3-128 over ``identity_normalize(caption)`` (``datahub.sample_id``: NFC,
newlines, trailing whitespace) in UTF-8, one ``0x00`` byte, and the 64 ASCII hex digits of ``image_sha256``.
The same picture with the same caption has one id from any file, format or engine; another caption or a
single changed image byte gives another. (A text sample's id hashes the text alone, so the two never meet.)

Export members (WebDataset, the names img2dataset and ``webdataset``'s decoders use): the image as
``KEY.jpg`` / ``KEY.png`` / ``KEY.webp`` (by ``image_format``), the caption as ``KEY.txt``, the other columns
in ``KEY.json``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from datahub.kinds.base import KindSpec, register_kind
from datahub.sample_id import identity_normalize

IMAGE = "image"
IMAGE_URI = "image_uri"
IMAGE_FORMAT = "image_format"
IMAGE_WIDTH = "image_width"
IMAGE_HEIGHT = "image_height"
IMAGE_BYTE_SIZE = "image_byte_size"
IMAGE_SHA256 = "image_sha256"

IMAGE_FIELDS = (
    pa.field(IMAGE, pa.binary()),
    pa.field(IMAGE_URI, pa.string()),
    pa.field(IMAGE_FORMAT, pa.string()),
    pa.field(IMAGE_WIDTH, pa.int32()),
    pa.field(IMAGE_HEIGHT, pa.int32()),
    pa.field(IMAGE_BYTE_SIZE, pa.int64()),
    pa.field(IMAGE_SHA256, pa.string()),
)

# Member extension of each format (what img2dataset writes and webdataset's decoders recognise).
MEMBER_EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp", "tiff": "tiff"}


def image_text_sample_id(caption: str, image_sha256: str) -> str:
    """One row's ``sample_id`` (see the module docstring)."""
    payload = identity_normalize(caption).encode("utf-8") + b"\x00" + image_sha256.encode("ascii")
    return xxhash.xxh3_128_hexdigest(payload)


def image_text_sample_ids(table: pa.Table) -> pa.Array:
    """``sample_id`` of every row; null where the caption or the image checksum is missing."""
    captions = table.column("text").to_pylist()
    digests = table.column(IMAGE_SHA256).to_pylist()
    return pa.array([None if c is None or d is None else image_text_sample_id(c, d) for c, d in zip(captions, digests)],
                    pa.string())


def image_members(table: pa.Table) -> dict[str, pa.Array]:
    """Export members: per extension (always the same ones, in ``MEMBER_EXTENSIONS`` order), the image bytes of
    the rows whose format has that extension, null elsewhere (a null writes no member)."""
    if IMAGE not in table.column_names:
        return {}
    images = table.column(IMAGE)
    formats = pc.fill_null(table.column(IMAGE_FORMAT), "") if IMAGE_FORMAT in table.column_names \
        else pa.array([""] * table.num_rows, pa.string())
    out: dict[str, pa.Array] = {}
    for fmt, extension in MEMBER_EXTENSIONS.items():
        chosen = pc.if_else(pc.equal(formats, fmt), images, pa.scalar(None, images.type))
        out[extension] = chosen.combine_chunks() if isinstance(chosen, pa.ChunkedArray) else chosen
    return out


IMAGE_TEXT = register_kind(KindSpec(
    name="image_text",
    fields=IMAGE_FIELDS,
    sample_ids=image_text_sample_ids,
    description="an image with its caption; sample_id = xxh3-128 of the identity-normalized caption, a 0x00 byte "
                "and the image's SHA-256 hex",
    members=image_members,
    member_columns=(IMAGE,),
))

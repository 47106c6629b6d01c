"""Turn indexed samples of a shard buffer into what the trainer receives; members are sliced lazily.

A decoder is bound once per shard (``decoder(index, view, shard_name)``) and returns a function
``(sample index, is_padding) -> sample``, so the per-sample work is one slice and one decode:
the shard's member bounds are looked up as plain int lists once, not per sample.

``batch_format="arrow"`` batches are ``pyarrow.RecordBatch``es (sample_id, text, is_padding) built from the
shard bytes without a Python str per sample: a DataLoader worker sends a batch to the trainer as a few
buffers (through its shared-memory ring, ``datahub.loader.worker_transport``) instead of pickling every text.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from datahub.errors import IntegrityError
from datahub.shards.index import ShardIndex

DecodeMode = Literal["text", "json", "bytes", "pil", "numpy", "structured"]
BatchFormat = Literal["list", "arrow"]
SampleReader = Callable[[int, bool], Any]
Decoder = Callable[[ShardIndex, memoryview, str], SampleReader]

_utf8 = codecs.utf_8_decode  # strict; the fastest str-from-buffer call in CPython (no bytes copy)


def _missing(index: ShardIndex, i: int, shard: str, extension: str) -> IntegrityError:
    return IntegrityError(f"shard {shard}: sample {index.keys[i]} has no .{extension} member")


def _text(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
    keys = index.keys
    starts, stops = index.bounds("txt")

    def sample(i: int, padding: bool) -> dict[str, Any]:
        start = starts[i]
        if start < 0:
            raise _missing(index, i, shard, "txt")
        return {"sample_id": keys[i], "text": _utf8(view[start : stops[i]], None, True)[0], "is_padding": padding}

    return sample


class TextColumns:
    """A shard bound for arrow batches: its sample keys, each sample's text member bounds as arrays, and the bytes."""

    __slots__ = ("keys", "starts", "stops", "view", "shard", "_index")

    def __init__(self, index: ShardIndex, view: memoryview, shard: str) -> None:
        starts, stops = index.bounds("txt")
        self.keys, self.view, self.shard, self._index = index.keys, view, shard, index
        self.starts, self.stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)

    def missing(self, indexes: np.ndarray) -> IntegrityError | None:
        """The error for the first of ``indexes`` without a .txt member, or None."""
        absent = indexes[self.starts[indexes] < 0]
        return _missing(self._index, int(absent[0]), self.shard, "txt") if len(absent) else None


def arrow_batch_from_columns(keys: list[str], texts: list[memoryview], lengths: np.ndarray,
                             padding: np.ndarray) -> pa.RecordBatch:
    """One RecordBatch (sample_id, text, is_padding) from gathered text views: one copy of the text bytes.

    Every column is made from buffers, never with ``pa.array``: pyarrow imports pandas (~25 MB, 240 mappings) on
    its first ``pa.array`` call, which every DataLoader fork then copies and tears down."""
    text = pa.Array.from_buffers(*_string_buffers(b"".join(texts), lengths))
    text.validate(full=True)  # UTF-8, as the "text" decoder checks it
    ids = "".join(keys).encode()
    id_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    if len(ids) != int(id_lengths.sum()):  # not all ASCII: byte lengths differ from character counts
        id_lengths = np.fromiter((len(key.encode()) for key in keys), dtype=np.int64, count=len(keys))
    flags = np.packbits(np.asarray(padding, dtype=bool), bitorder="little")
    return pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(*_string_buffers(ids, id_lengths)), text,
         pa.Array.from_buffers(pa.bool_(), len(padding), [None, pa.py_buffer(flags)])],
        names=["sample_id", "text", "is_padding"])


def _string_buffers(data: bytes, lengths: np.ndarray) -> tuple[pa.DataType, int, list[pa.Buffer | None]]:
    """``Array.from_buffers`` arguments of a string array of ``len(lengths)`` values laid end to end in ``data``
    (large_string when the bytes pass 2 GiB)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] >= 2**31
    return ((pa.large_string() if large else pa.string()), len(lengths),
            [None, pa.py_buffer(offsets if large else offsets.astype(np.int32)), pa.py_buffer(data)])


def _raw(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
    keys, members = index.keys, index.members

    def sample(i: int, padding: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"sample_id": keys[i], "is_padding": padding}
        for ext, (offset, size) in members[i].items():
            out[ext] = view[offset : offset + size].tobytes()
        return out

    return sample


def _json(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
    keys, members = index.keys, index.members

    def sample(i: int, padding: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"sample_id": keys[i], "is_padding": padding}
        for ext, (offset, size) in members[i].items():
            if ext == "txt":
                out["text"] = _utf8(view[offset : offset + size], None, True)[0]
            elif ext == "json":
                out["meta"] = json.loads(view[offset : offset + size].tobytes())
            else:
                out[ext] = view[offset : offset + size].tobytes()
        return out

    return sample


# Image members of image_text samples, as img2dataset and webdataset name them: datahub.kinds.media's
# MEMBER_EXTENSIONS (what the export writes) plus "jpeg". Restated, not imported, because importing datahub.kinds
# costs a trainer ~120 ms; tests/loader/test_structured_images.py checks that the two agree.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tiff")


def _image_member(sample: dict[str, Any]) -> str | None:
    """The extension of the sample's image member, None when it has none."""
    return next((e for e in IMAGE_EXTENSIONS if e in sample), None)


def _image(as_array: bool) -> Decoder:
    """Like "json", plus ``image``: the image member decoded to RGB (a PIL image, or uint8 H x W x 3 numpy),
    as webdataset's "pil" and "rgb8" decoders give it but upright (its EXIF Orientation applied, which those do not);
    None for a sample without an image member."""

    def bind(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
        import io

        from PIL import Image, ImageOps

        parsed = _json(index, view, shard)

        def sample(i: int, padding: bool) -> dict[str, Any]:
            out = parsed(i, padding)
            extension = _image_member(out)
            image = None
            if extension is not None:
                data = out.pop(extension)
                try:
                    with Image.open(io.BytesIO(data)) as opened:
                        # EXIF Orientation (a phone's portrait photo is stored sideways): shown upright, as every
                        # viewer and the caption's writer saw it; a no-op for the usual tag 1 or none
                        upright = ImageOps.exif_transpose(opened) if opened.getexif().get(0x0112, 1) != 1 else opened
                        image = upright.convert("RGB")
                except Exception as exc:
                    raise IntegrityError(f"shard {shard}: sample {index.keys[i]}: .{extension} does not decode "
                                         f"({type(exc).__name__}: {exc})") from exc
            out["image"] = np.asarray(image) if as_array and image is not None else image
            return out

        return sample

    return bind


# The structure of the post-training kinds (datahub.kinds.posttraining) lifted from the .json member by "structured".
KIND_FIELDS = {
    "chat": ("messages", "tools"),
    "preference": ("prompt", "chosen", "rejected", "chosen_score", "rejected_score"),
    "trajectory": ("episode_id", "step_offset", "episode_steps", "steps"),
}
_JSON_TEXT_FIELDS = ("tool_calls", "tool_call")  # JSON text columns in MESSAGE / STEP structs


def _parsed(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _structure(items: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Messages or steps with their JSON-text fields (tool_calls, tool_call) parsed into objects."""
    if items is None:
        return None
    return [{k: _parsed(v) if k in _JSON_TEXT_FIELDS else v for k, v in item.items()} for item in items]


# the image format of each member extension whose name differs from it (datahub.kinds.media.MEMBER_EXTENSIONS read
# backwards), for a sample whose .json member does not say its image_format
_FORMAT_OF_EXTENSION = {"jpg": "jpeg"}


def _structured(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
    """Like "json", plus the sample's kind and its structure at top level: chat ``messages`` (+ ``tools``),
    preference ``prompt``/``chosen``/``rejected`` (+ scores), trajectory ``episode_id``, ``step_offset``,
    ``episode_steps`` and ``steps``; message ``tool_calls``, step ``tool_call`` and ``tools`` parsed from
    their JSON text; image_text ``image`` (the encoded file's bytes, None for a sample whose image is only
    referenced by ``image_uri``) and ``image_format``, the lake's column names, instead of a key per member
    extension (jpg, png, webp), so one loop over all kinds reads one key. Samples of other kinds come as "json"
    gives them, with ``kind``."""
    parsed = _json(index, view, shard)

    def sample(i: int, padding: bool) -> dict[str, Any]:
        out = parsed(i, padding)
        meta = out.get("meta")
        if not isinstance(meta, dict):
            raise IntegrityError(f"shard {shard}: sample {index.keys[i]} has no .json member with its structure")
        kind = meta.get("kind")
        out["kind"] = kind
        for field in KIND_FIELDS.get(str(kind), ()):
            value = meta.get(field)
            if field in ("messages", "prompt", "chosen", "rejected", "steps"):
                value = _structure(value)
            elif field == "tools":
                value = _parsed(value)
            out[field] = value
        if kind == "image_text":
            extension = _image_member(out)
            out["image"] = out.pop(extension) if extension is not None else None
            out["image_format"] = meta.get("image_format") or (
                _FORMAT_OF_EXTENSION.get(extension, extension) if extension is not None else None)
        return out

    return sample


def replay_steps(samples: Iterable[Mapping[str, Any]], episode_id: str, start: int = 0,
                 stop: int | None = None) -> list[dict[str, Any]]:
    """Steps ``[start, stop)`` of one episode reassembled from its trajectory segments (rows of at most
    ``MAX_STEPS_PER_ROW`` steps, each with ``step_offset``) among ``samples`` ("structured" samples, in any
    order, other episodes and kinds skipped); ``stop=None``: to the episode's end. A step of the range that no
    segment holds (a segment not among the samples, e.g. dropped or on another rank) is an error."""
    if start < 0 or (stop is not None and stop < start):
        raise ValueError(f"step range [{start}, {stop}) is not a range")
    held: dict[int, dict[str, Any]] = {}
    length: int | None = None
    for s in samples:
        if s.get("kind") != "trajectory" or s.get("episode_id") != episode_id:
            continue
        length = s.get("episode_steps") if length is None else length
        offset = int(s["step_offset"])
        for j, step in enumerate(s["steps"]):
            if start <= offset + j and (stop is None or offset + j < stop):
                held[offset + j] = step
    if length is None:
        raise KeyError(f"no segment of episode {episode_id!r} among the samples")
    end = length if stop is None else min(stop, length)
    missing = [i for i in range(start, end) if i not in held]
    if missing:
        raise IntegrityError(f"episode {episode_id!r}: steps {missing[0]}..{missing[-1]} of [{start}, {end}) are "
                             f"in no segment among the samples ({len(missing)} missing)")
    return [held[i] for i in range(start, end)]


def make_decoder(decode: DecodeMode | Callable[[dict[str, Any]], Any]) -> Decoder:
    """"text": {sample_id, text, is_padding}; "json": adds meta (the parsed .json) and other members as bytes;
    "bytes": every member as bytes keyed by extension; "pil" / "numpy": "json" with the image member decoded
    to an RGB PIL image / uint8 array as ``image``; "structured": "json" with the post-training structure at
    top level and an image_text sample's ``image`` bytes and ``image_format`` (``_structured``); a callable
    receives the "bytes" dict."""
    if decode == "text":
        return _text
    if decode == "json":
        return _json
    if decode == "bytes":
        return _raw
    if decode in ("pil", "numpy"):
        return _image(as_array=decode == "numpy")
    if decode == "structured":
        return _structured
    if callable(decode):
        user = decode

        def _custom(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
            raw = _raw(index, view, shard)
            return lambda i, padding: user(raw(i, padding))

        return _custom
    raise ValueError(f"decode must be 'text', 'json', 'bytes', 'pil', 'numpy', 'structured' or a callable; "
                     f"got {decode!r}")

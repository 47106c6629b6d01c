"""Turn indexed samples of a shard buffer into what the trainer receives; members are sliced lazily.

A decoder is bound once per shard (``decoder(index, view, shard_name)``) and returns a function
``(sample index, is_padding) -> sample``, so the per-sample work is one slice and one decode:
the shard's member bounds are looked up as plain int lists once, not per sample.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable
from typing import Any, Literal

from datahub.errors import IntegrityError
from datahub.shards.index import ShardIndex

DecodeMode = Literal["text", "json", "bytes"]
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


def make_decoder(decode: DecodeMode | Callable[[dict[str, Any]], Any]) -> Decoder:
    """"text": {sample_id, text, is_padding}; "json": adds meta (the parsed .json) and other members as bytes;
    "bytes": every member as bytes keyed by extension; a callable receives the "bytes" dict."""
    if decode == "text":
        return _text
    if decode == "json":
        return _json
    if decode == "bytes":
        return _raw
    if callable(decode):
        user = decode

        def _custom(index: ShardIndex, view: memoryview, shard: str) -> SampleReader:
            raw = _raw(index, view, shard)
            return lambda i, padding: user(raw(i, padding))

        return _custom
    raise ValueError(f"decode must be 'text', 'json', 'bytes' or a callable; got {decode!r}")

"""Turn one indexed sample of a shard buffer into what the trainer receives; members are sliced lazily."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from datahub.errors import IntegrityError
from datahub.loader.tar_index import ShardIndex

DecodeMode = Literal["text", "json", "bytes"]
Decoder = Callable[[ShardIndex, memoryview, int, bool, str], Any]


def _text(index: ShardIndex, view: memoryview, i: int, padding: bool, shard: str) -> dict[str, Any]:
    try:
        offset, size = index.members[i]["txt"]
    except KeyError:
        raise IntegrityError(f"shard {shard}: sample {index.keys[i]} has no .txt member") from None
    return {"sample_id": index.keys[i], "text": str(view[offset : offset + size], "utf-8"), "is_padding": padding}


def _raw(index: ShardIndex, view: memoryview, i: int, padding: bool, shard: str) -> dict[str, Any]:
    sample: dict[str, Any] = {"sample_id": index.keys[i], "is_padding": padding}
    for ext, (offset, size) in index.members[i].items():
        sample[ext] = view[offset : offset + size].tobytes()
    return sample


def _json(index: ShardIndex, view: memoryview, i: int, padding: bool, shard: str) -> dict[str, Any]:
    sample: dict[str, Any] = {"sample_id": index.keys[i], "is_padding": padding}
    for ext, (offset, size) in index.members[i].items():
        if ext == "txt":
            sample["text"] = str(view[offset : offset + size], "utf-8")
        elif ext == "json":
            sample["meta"] = json.loads(view[offset : offset + size].tobytes())
        else:
            sample[ext] = view[offset : offset + size].tobytes()
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

        def _custom(index: ShardIndex, view: memoryview, i: int, padding: bool, shard: str) -> Any:
            return user(_raw(index, view, i, padding, shard))

        return _custom
    raise ValueError(f"decode must be 'text', 'json', 'bytes' or a callable; got {decode!r}")

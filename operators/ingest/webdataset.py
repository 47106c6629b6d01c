"""WebDataset tar shards of image-text pairs (kind ``image_text``), the layout img2dataset writes.

A sample is the run of consecutive tar members sharing a key (the member path up to the first dot of its
file name, as ``webdataset`` groups them): ``KEY.jpg`` / ``.jpeg`` / ``.png`` / ``.webp`` (the image),
``KEY.txt`` (the caption) and ``KEY.json`` (metadata; its ``caption`` field when there is no ``.txt``).
``source_offset`` = the sample's ordinal in the shard (0-based); ``meta`` = the JSON object plus ``key`` (a JSON
member that is not an object is kept as ``meta["json"]``).
A member larger than ``max_record_bytes`` (image, caption or JSON) is not read: its sample is quarantined as
``oversize`` naming the member.
Bad samples (no image, no caption, bad JSON, bad media) are quarantined with the reason; a shard that breaks
off mid-way keeps the samples read before the break and quarantines the rest as one ``unreadable_file``.
"""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from operators.ingest.base import RAW_PREVIEW_BYTES, InputFile, Reader, _Buffer, register_reader
from operators.ingest.media import IMAGE_BATCH_ROWS, add_image_record

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
_KEY = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset.tariterators.base_plus_ext


def split_key(path: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member path, extension lowercased; None for a name without one."""
    match = _KEY.match(path)
    return (match.group(1), match.group(2).lower()) if match else None


@dataclass(frozen=True)
class Oversize:
    """A member larger than ``max_record_bytes``: its first bytes and its size, not its body."""

    preview: bytes
    size: int


@register_reader
class WebDatasetReader(Reader):
    format = "webdataset"
    kinds = ("image_text",)
    suffixes = (".tar", ".tar.gz", ".tgz")

    def __init__(self, *, max_record_bytes: int, batch_rows: int = 2048) -> None:
        super().__init__(max_record_bytes=max_record_bytes, batch_rows=max(1, min(batch_rows, IMAGE_BATCH_ROWS)))

    def records(self, file: InputFile, buffer: _Buffer) -> Iterator[None]:
        with self.open(file) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            ordinal = 0
            key: str | None = None
            members: dict[str, bytes | Oversize] = {}
            for info in tar:
                if not info.isfile():
                    continue
                parts = split_key(info.name)
                if parts is None or parts[0].startswith("__"):  # __index__ and the like are not samples
                    continue
                if key is not None and parts[0] != key:
                    self._sample(file, buffer, ordinal, key, members)
                    ordinal += 1
                    members = {}
                    yield None
                key = parts[0]
                handle = tar.extractfile(info)
                if handle is None:
                    members[parts[1]] = b""
                elif info.size > self.max_record_bytes:  # never held whole: a preview, and the size for the detail
                    members[parts[1]] = Oversize(handle.read(RAW_PREVIEW_BYTES), info.size)
                else:
                    members[parts[1]] = handle.read()
            if key is not None:
                self._sample(file, buffer, ordinal, key, members)
                yield None

    def _sample(self, file: InputFile, buffer: _Buffer, ordinal: int, key: str,
                members: dict[str, bytes | Oversize]) -> None:
        big = [(ext, m) for ext, m in members.items() if isinstance(m, Oversize)]
        if big:
            ext, member = big[0]
            buffer.quarantine(ordinal, "oversize", f"{key}.{ext}: {member.size} bytes > max_record_bytes="
                              f"{self.max_record_bytes}", member.preview)
            return
        self._checked_sample(buffer, ordinal, key, cast(dict[str, bytes], members))

    def _checked_sample(self, buffer: _Buffer, ordinal: int, key: str, members: dict[str, bytes]) -> None:
        meta: dict[str, Any] = {}
        if "json" in members:
            try:
                parsed = json.loads(members["json"])
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                buffer.quarantine(ordinal, "invalid_json", f"{key}.json: {exc}", members["json"])
                return
            if isinstance(parsed, dict):
                meta.update(parsed)
            elif parsed is not None:  # a list or a scalar: kept, not dropped
                meta["json"] = parsed
        caption: Any = None
        if "txt" in members:
            try:
                caption = members["txt"].decode("utf-8")
            except UnicodeDecodeError as exc:
                buffer.quarantine(ordinal, "invalid_utf8", f"{key}.txt: {exc}", members["txt"])
                return
        elif isinstance(meta.get("caption"), str):
            caption = meta.pop("caption")
        meta["key"] = key
        extension = next((e for e in IMAGE_EXTENSIONS if e in members), None)
        image = members.get(extension) if extension is not None else None
        add_image_record(buffer, offset=ordinal, caption=caption, image=image, image_uri=None, meta=meta,
                         max_record_bytes=self.max_record_bytes, caption_field=f"{key}.txt")

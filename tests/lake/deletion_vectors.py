"""Deletion vectors as Spark/Databricks write them (``delta.enableDeletionVectors``), committed by hand: no Delta
writer here can (delta-spark ships no jars and there is no Maven; delta-rs rewrites files on DELETE).

A vector is the Delta protocol's RoaringBitmapArray (magic 1681511377, then 64-bit keys and portable 32-bit roaring
bitmaps), inline in the log as Z85 text (storage type ``i``), or named in a file (``u``) that we do not write, so a
reader of that vector fails as on a table whose vector file was lost."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from datahub.lake import Lake

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_MAGIC = 1681511377  # RoaringBitmapArray, Delta protocol "Deletion Vector Format"
_NO_RUN_CONTAINER = 12346  # the portable roaring format's cookie without run containers


def z85(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)  # Delta pads to a multiple of 4; sizeInBytes keeps the real length
    out = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def bitmap_array(rows: list[int]) -> bytes:
    """The serialized vector of ``rows`` (file row positions < 65536: one array container)."""
    values = sorted(rows)
    bitmap = struct.pack("<II", _NO_RUN_CONTAINER, 1) + struct.pack("<HH", 0, len(values) - 1) + struct.pack("<I", 16)
    bitmap += b"".join(struct.pack("<H", v) for v in values)
    return struct.pack("<iq", _MAGIC, 1) + struct.pack("<I", 0) + bitmap


def delete_rows(lake: Lake, table: str, deleted: list[int], *, inline: bool = True) -> None:
    """Commit what Spark's DELETE writes with deletion vectors on a table of one data file: protocol 3/7 with the
    deletionVectors feature, the file removed and added back with a vector of ``deleted`` (its statistics unchanged
    but for ``tightBounds: false``); ``inline=False``: the vector in a file (``u``) that does not exist."""
    log = Path(lake.table_uri(table)) / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json"))
    adds = [json.loads(line)["add"] for p in sorted(log.glob("*.json")) for line in p.read_text().splitlines()
            if '"add"' in line]
    (add,) = adds
    data = bitmap_array(deleted)
    vector: dict[str, Any] = (
        {"storageType": "i", "pathOrInlineDv": z85(data), "sizeInBytes": len(data), "cardinality": len(deleted)}
        if inline else {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1,
                        "sizeInBytes": 36, "cardinality": len(deleted)})
    now = 1_765_000_000_000
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
        {"commitInfo": {"timestamp": now, "operation": "DELETE", "operationParameters": {"predicate": "[]"}}},
        {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                    "partitionValues": add["partitionValues"], "size": add["size"]}},
        {"add": {**add, "modificationTime": now, "stats": json.dumps({**json.loads(add["stats"]), "tightBounds": False}),
                 "deletionVector": vector}},
    ]
    (log / f"{version + 1:020d}.json").write_text("".join(json.dumps(action) + "\n" for action in actions))

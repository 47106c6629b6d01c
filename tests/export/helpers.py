"""Small lakes for export tests: a samples table with unique ids, texts of varied size and a binary column."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from datahub.lake import Lake
from datahub.storage import StorageConfig, validate_storage_config


def samples_table(n: int, *, start: int = 0, with_binary: bool = False) -> pa.Table:
    ids = [hashlib.sha256(f"doc {i}".encode()).hexdigest()[:32] for i in range(start, start + n)]
    columns = {
        "sample_id": ids,
        "text": [f"document {i} " + "word " * (i % 37) for i in range(start, start + n)],
        "source_uri": [f"file:///in/part-{i % 3}.jsonl" for i in range(start, start + n)],
        "source_offset": pa.array(list(range(start, start + n)), pa.int64()),
        "meta": [json.dumps({"n": i}) for i in range(start, start + n)],
        "quality": [{"words": i % 37 + 2, "score": (i % 10) / 10} for i in range(start, start + n)],
    }
    if with_binary:
        columns["png"] = pa.array([bytes([i % 256]) * (i % 50 + 1) for i in range(start, start + n)], pa.binary())
    return pa.table(columns)


def make_lake(root: Path | str, n: int = 120, *, with_binary: bool = False, storage_options=None) -> tuple[Lake, int]:
    lake = Lake(root, storage_options=storage_options)
    version = lake.commit("samples", samples_table(n, with_binary=with_binary), txn="seed/1")
    assert version is not None
    return lake, version


def cfs_storage(*paths: tuple[str, Path], policy: dict | None = None) -> StorageConfig:
    raw = {"tiers": {name: {"kind": "cfs", "path": str(path)} for name, path in paths}}
    if policy:
        raw["policy"] = policy
    return validate_storage_config(raw, source="test-storage.yaml")


@contextmanager
def publish_held_halfway(tier: Any, uri: str, data: bytes) -> Iterator[None]:
    """Another writer's ``tier.publish_stream`` of ``data`` to ``uri`` (a concurrent export or tier apply), held
    after its first half is written while the block runs; on leaving, it finishes and must have succeeded."""
    wrote_half, finish = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def chunks() -> Iterator[bytes]:
        yield data[: len(data) // 2]
        wrote_half.set()
        finish.wait(60)
        yield data[len(data) // 2:]

    def writer() -> None:
        try:
            tier.publish_stream(uri, chunks(), size=len(data), sha256=hashlib.sha256(data).hexdigest())
        except BaseException as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert wrote_half.wait(60)
        yield
    finally:
        finish.set()
        thread.join(60)
    assert errors == []


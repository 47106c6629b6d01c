"""Test fixture: write N small shards in the export contract's layout, plus a manifest.

Independent of datahub.export on purpose, so loader tests pin the contract, not the exporter.
Each sample is the consecutive members ``KEY.txt``, ``KEY.json`` and (optionally) ``KEY.bin``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any


def sample_id(shard: int, index: int) -> str:
    """A hex sample id that encodes where the fixture put the sample (no dots)."""
    return f"{shard:04x}{index:06x}"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_release(
    root: Path,
    *,
    release: str = "demo-v1",
    samples_per_shard: list[int] | tuple[int, ...] = (7, 7, 7, 5),
    tiers: tuple[str, ...] = ("cfs",),
    with_binary: bool = False,
    text_bytes: int = 40,
) -> dict[str, Any]:
    """Write shards into ``root/<tier>/`` for every tier and ``root/manifest.json``; return the manifest."""
    root = Path(root)
    shards = []
    total = 0
    for shard_index, count in enumerate(samples_per_shard):
        name = f"{release}-{shard_index:06d}.tar"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for index in range(count):
                key = sample_id(shard_index, index)
                base = f"sample {key} of shard {shard_index} "
                text = (base * (text_bytes // len(base) + 1))[: max(text_bytes, 24)]
                meta = {"sample_id": key, "source_uri": f"file:///in/{shard_index}.jsonl",
                        "meta": {"shard": shard_index, "index": index}}
                _add(tar, f"{key}.txt", text.encode())
                _add(tar, f"{key}.json", json.dumps(meta).encode())
                if with_binary:
                    _add(tar, f"{key}.bin", bytes([index % 256]) * 5)
        data = buffer.getvalue()
        replicas = {}
        for tier in tiers:
            path = root / tier / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            replicas[tier] = str(path)
        shards.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                       "samples": count, "replicas": replicas})
        total += count
    manifest = {"manifest_version": 1, "release": release, "created": "2026-12-02T18:00:00Z",
                "table_version": 3, "release_digest": hashlib.sha256(release.encode()).hexdigest(),
                "num_samples": total, "shuffle_seed": 0, "shards": shards}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def all_ids(manifest: dict[str, Any]) -> list[str]:
    return [sample_id(s, i) for s, shard in enumerate(manifest["shards"]) for i in range(shard["samples"])]

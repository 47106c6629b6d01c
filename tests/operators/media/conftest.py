"""Real pictures for the media tests: the bundled demo set (data/images, built by data/images/generate.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "data" / "images"


def shard_members(path: Path = IMAGES / "demo-00000.tar") -> dict[str, dict[str, bytes]]:
    """key -> {extension: bytes} of a WebDataset shard."""
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for info in tar:
            handle = tar.extractfile(info)
            key, ext = info.name.split(".", 1)
            out.setdefault(key, {})[ext] = handle.read() if handle else b""
    return out


@pytest.fixture(scope="session")
def demo_members() -> dict[str, dict[str, bytes]]:
    return shard_members()


@pytest.fixture(scope="session")
def truth() -> dict[str, dict]:
    return json.loads((IMAGES / "truth.json").read_text())


def image_of(members: dict[str, bytes]) -> bytes:
    return next(v for k, v in members.items() if k in ("jpg", "png", "webp"))


def encode_png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()

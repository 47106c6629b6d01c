from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.loader.shards import write_release

# 26 samples over 4 shards: divides evenly by neither 3 ranks nor 2 x 2 consumers.
UNEVEN_SHARDS = (7, 7, 7, 5)


@pytest.fixture
def release(tmp_path: Path) -> dict[str, Any]:
    return write_release(tmp_path / "export", samples_per_shard=UNEVEN_SHARDS)


@pytest.fixture
def manifest_path(tmp_path: Path, release: dict[str, Any]) -> str:
    return str(tmp_path / "export" / "manifest.json")

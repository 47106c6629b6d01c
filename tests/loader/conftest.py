from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.loader.shards import write_release

# 29 samples over 5 shards of unequal size: uneven for 2 and 3 ranks (29 = 2*14 + 1 = 3*9 + 2), for
# 2 ranks x 2 workers (29 = 4*7 + 1), and the rank spans cut through the middle of shards.
UNEVEN_SHARDS = (7, 6, 5, 7, 4)


@pytest.fixture(autouse=True)
def verdict_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own user cache directory, so the loader's default sha256 verdict store starts empty."""
    cache_home = tmp_path_factory.mktemp("cache-home")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    return cache_home / "datahub" / "verified"


@pytest.fixture
def release(tmp_path: Path) -> dict[str, Any]:
    return write_release(tmp_path / "export", samples_per_shard=UNEVEN_SHARDS)


@pytest.fixture
def manifest_path(tmp_path: Path, release: dict[str, Any]) -> str:
    return str(tmp_path / "export" / "manifest.json")

"""Tier.publish on cfs, buffered: a temp file written in small pieces, its writeback started as it goes, fsync, rename."""

from __future__ import annotations

import os
from pathlib import Path

import datahub.storage.tier as tier_module
from datahub.storage import validate_storage_config

DATA = os.urandom(13 * 2**20 + 777)


def _tier(root: Path):
    # buffered writes (direct_io: off): the writeback hints belong to that path (test_cfs_direct_io.py: O_DIRECT)
    return validate_storage_config({"tiers": {"t": {"kind": "cfs", "path": str(root), "direct_io": "off"}}}).tier("t")


def test_publish_starts_writeback_of_each_written_stretch_and_publishes_the_bytes(tmp_path, monkeypatch) -> None:
    started: list[tuple[int, int]] = []
    real = tier_module._start_writeback
    monkeypatch.setattr(tier_module, "_start_writeback", lambda fd, offset, length: (started.append((offset, length)),
                                                                                      real(fd, offset, length)))
    target = _tier(tmp_path / "cfs")
    uri = target.uri("rel", "big.tar")
    target.publish(uri, DATA)
    assert Path(uri).read_bytes() == DATA
    assert [offset for offset, _ in started] == [0, *(sum(n for _, n in started[:i]) for i in range(1, len(started)))]
    assert len(started) == 3 and all(length >= tier_module._WRITEBACK_PIECE for _, length in started)
    assert not [p for p in Path(uri).parent.iterdir() if p.name != "big.tar"]  # no temp file left


def test_publish_does_not_depend_on_writeback_hints(tmp_path, monkeypatch) -> None:
    """Where libc has no sync_file_range (or it fails), publish writes the same bytes (fsync does the work)."""
    monkeypatch.setattr(tier_module, "_sync_file_range", lambda: None)
    target = _tier(tmp_path / "cfs")
    uri = target.uri("rel", "big.tar")
    target.publish(uri, DATA)
    target.publish(target.uri("rel", "small.json"), b"{}")
    assert Path(uri).read_bytes() == DATA and Path(target.uri("rel", "small.json")).read_bytes() == b"{}"

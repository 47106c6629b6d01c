"""The write seam (datahub.engines.sink) on every engine: tasks write files, the driver commits or aborts."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datahub.engines.arrow import ArrowEngine
from datahub.engines.sink import Sink, write_batches, write_frame


@dataclass(frozen=True)
class FolderSink(Sink[tuple[str, int], dict]):
    """Each task writes one Parquet file into ``folder``; the commit writes a manifest naming them."""

    folder: str
    fail_commit: bool = False

    def start(self) -> None:
        os.makedirs(self.folder, exist_ok=True)

    def write(self, batches: Iterable[pa.Table]) -> tuple[str, int]:
        tables = [t for t in batches if t.num_rows]
        path = os.path.join(self.folder, f"part-{uuid.uuid4().hex}.parquet")
        if tables:
            pq.write_table(pa.concat_tables(tables), path)
        return path, sum(t.num_rows for t in tables)

    def commit(self, results: list[tuple[str, int]]) -> dict:
        if self.fail_commit:
            raise RuntimeError("commit refused")
        manifest = {"files": sorted(p for p, n in results if n), "rows": sum(n for _, n in results)}
        Path(self.folder, "manifest.json").write_text(json.dumps(manifest))
        return manifest

    def abort(self, results: list[tuple[str, int]], error: BaseException) -> None:
        for path, rows in results:
            if rows:
                os.remove(path)


def rows(n: int) -> pa.Table:
    return pa.table({"x": list(range(n))})


def read_back(manifest: dict) -> list[int]:
    return sorted(v for f in manifest["files"] for v in pq.read_table(f).column("x").to_pylist())


@pytest.mark.parametrize("engine", ["arrow", "ray", "spark"])
def test_tasks_write_and_the_driver_commits(engine, tmp_path, request):
    frame_engine = ArrowEngine(batch_size=100) if engine == "arrow" else request.getfixturevalue(f"{engine}_engine")
    frame = frame_engine.from_arrow(rows(1000))
    manifest = write_frame(frame, FolderSink(str(tmp_path / engine)))
    assert manifest["rows"] == 1000 and read_back(manifest) == list(range(1000))
    assert len(manifest["files"]) >= 1


def test_a_failed_commit_aborts_and_removes_the_tasks_files(tmp_path):
    frame = ArrowEngine(batch_size=100).from_arrow(rows(500))
    with pytest.raises(RuntimeError, match="commit refused"):
        write_frame(frame, FolderSink(str(tmp_path), fail_commit=True))
    assert sorted(os.listdir(tmp_path)) == []  # ten files written, all removed


def test_driver_side_batches_are_one_task(tmp_path):
    manifest = write_batches((rows(10) for _ in range(3)), FolderSink(str(tmp_path)))
    assert len(manifest["files"]) == 1 and manifest["rows"] == 30

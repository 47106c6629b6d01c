"""Every Parquet file the lake writes is compressed and cuts its pages finely, whichever writer made it."""

from __future__ import annotations

import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datahub.lake.files import ParquetTarget, write_file
from datahub.lake.lake import COMPRESSION, Lake
from datahub.lineage.optimize import optimize_lineage


def _texts(rows: int, width: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ", dtype=np.uint8)
    return pa.table({"sample_id": pa.array([f"{seed:08x}{i:024x}" for i in range(rows)]),
                     "text": pa.array([letters[rng.integers(0, 27, width)].tobytes().decode() for _ in range(rows)])})


def _codecs(folder: str) -> set[str]:
    codecs = set()
    for path in glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True):
        metadata = pq.ParquetFile(path).metadata
        for group in range(metadata.num_row_groups):
            for column in range(metadata.num_columns):
                codecs.add(metadata.row_group(group).column(column).compression)
    return codecs


def test_commits_with_row_groups_and_streamed_commits_are_compressed(tmp_path):
    """delta-rs compresses only when given no WriterProperties: a commit naming its row groups (lineage, merge,
    redact, every streamed commit) wrote UNCOMPRESSED files before."""
    lake = Lake(str(tmp_path / "lake"))
    lake.commit("plain", _texts(200, 300), txn="t-plain")
    lake.commit("grouped", _texts(200, 300), txn="t-grouped", row_group_rows=64)
    lake.commit("streamed", iter([_texts(100, 300, 1), _texts(100, 300, 2)]), txn="t-streamed",
                schema=_texts(1, 1).schema)
    for name in ("plain", "grouped", "streamed"):
        assert _codecs(lake.table_uri(name)) == {COMPRESSION}, name
    assert lake.read("streamed").num_rows == 200


def test_optimized_lineage_stays_compressed(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    rows = _texts(300, 40).rename_columns(["sample_id", "detail"])
    for part in range(3):
        lake.commit("lineage", rows.slice(part * 100, 100), txn=f"t-{part}")
    before = set(glob.glob(os.path.join(lake.table_uri("lineage"), "*.parquet")))
    optimize_lineage(lake)
    written = set(glob.glob(os.path.join(lake.table_uri("lineage"), "*.parquet"))) - before
    assert written
    for path in written:
        metadata = pq.ParquetFile(path).metadata
        assert {metadata.row_group(0).column(c).compression for c in range(metadata.num_columns)} == {COMPRESSION}


def _page_peak(path: str) -> int:
    """Arrow bytes held at most while reading 64 rows at a time with a buffered reader (as scan_batches does)."""
    pool = pa.default_memory_pool()
    base, peak = pool.bytes_allocated(), 0
    with pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False) as parquet:
        for batch in parquet.iter_batches(batch_size=64, use_threads=False):
            peak = max(peak, pool.bytes_allocated() - base)
            del batch
    return peak


def test_an_engine_file_of_wide_rows_is_cut_into_small_pages(tmp_path):
    """600 rows of 250 KB in one row group: with pages checked every 1,024 values (pyarrow's default) the whole
    column chunk was one 150 MB page that any read of one row decoded; now a page holds <= 64 rows (~16 MB)."""
    table = _texts(600, 250_000)
    target = ParquetTarget(directory=str(tmp_path / "t"), schema=table.schema, row_group_rows=1000)
    assert write_file(target, [table]) is not None
    [path] = glob.glob(str(tmp_path / "t" / "*.parquet"))
    assert pq.ParquetFile(path).metadata.row_group(0).column(1).compression == COMPRESSION
    assert _page_peak(path) < 60 * 2**20  # 64 rows of 250 KB, the read's batch and the reader's buffer

"""The local export's spill: rows appended in read order, gathered shard by shard in export order; large columns
read once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from datahub.export import export_table_version
from datahub.export.source import TableSource
from datahub.export.spill import RowSpill
from tests.export.helpers import cfs_storage, make_lake


def test_row_spill_gathers_rank_ranges_in_order(tmp_path) -> None:
    rng = np.random.default_rng(3)
    rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 3000, 500)]
    ranks = rng.permutation(500)  # row i (read order) has export rank ranks[i]
    spill = RowSpill(str(tmp_path), rows=500)
    values = pa.array(rows, pa.large_binary())
    for start, end in ((0, 7), (7, 200), (200, 499), (499, 500)):  # uneven batches, sliced arrays (offsets != 0)
        spill.add(ranks[start:end], values.slice(start, end - start))
    spill.finish()
    by_rank = {int(r): rows[i] for i, r in enumerate(ranks)}
    assert spill.sizes.tolist() == [len(by_rank[r]) for r in range(500)]
    buffer = bytearray(3000 * 500 + 7)
    for start, count in ((0, 1), (1, 80), (150, 200), (81, 37), (400, 100)):  # any order (repairs, resumes)
        written = spill.gather(start, count, memoryview(buffer))
        assert bytes(buffer[:written]) == b"".join(by_rank[r] for r in range(start, start + count))
    spill.close()


def test_row_spill_buckets_by_rank_and_releases_built_ones(tmp_path) -> None:
    rng = np.random.default_rng(5)
    rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 3000, 700)]
    rows[10] = b""  # an empty row
    ranks = rng.permutation(700)
    spill = RowSpill(str(tmp_path), rows=700, bucket_bytes=20_000)  # ~13 rows a bucket: many buckets
    values = pa.array(rows, pa.large_binary())
    for start, end in ((0, 300), (300, 301), (301, 700)):
        spill.add(ranks[start:end], values.slice(start, end - start))
    spill.finish()
    by_rank = {int(r): rows[i] for i, r in enumerate(ranks)}
    assert spill.bucket_rows > 1 and len(list(tmp_path.iterdir())) == -(-700 // spill.bucket_rows)
    buffer = bytearray(3000 * 700)
    for start in range(0, 700, 50):  # shards in order, each releasing what it no longer needs
        written = spill.gather(start, 50, memoryview(buffer))
        assert bytes(buffer[:written]) == b"".join(by_rank[r] for r in range(start, start + 50))
        spill.release(start + 50)
        spill.finish()  # the writer thread removes them
        assert len(list(tmp_path.iterdir())) == -(-700 // spill.bucket_rows) - (start + 50) // spill.bucket_rows
    spill.close()


def test_row_spill_caps_its_open_files(tmp_path) -> None:
    rows = [bytes([i % 256]) * (i + 1) for i in range(300)]
    spill = RowSpill(str(tmp_path), rows=300, bucket_bytes=1, max_buckets=7)  # 1-byte buckets wanted, 7 files at most
    spill.add(np.arange(300)[::-1].copy(), pa.array(rows, pa.large_binary()))
    spill.finish()
    assert len(list(tmp_path.iterdir())) == 7
    buffer = bytearray(sum(map(len, rows)))
    assert bytes(buffer[:spill.gather(0, 300, memoryview(buffer))]) == b"".join(rows[::-1])
    spill.close()


def test_local_export_reads_the_large_columns_once(tmp_path, monkeypatch) -> None:
    lake, version = make_lake(tmp_path / "lake", 80, with_binary=True)
    scans: list[object] = []
    real_scan = TableSource.scan

    def scan(self, columns, **kwargs):
        scans.append(columns)
        return real_scan(self, columns, **kwargs)

    monkeypatch.setattr(TableSource, "scan", scan)
    manifest = export_table_version(lake, table="samples", version=version, release_name="rel", tier="cfs",
                                    storage=cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=9, shuffle_seed=4)
    assert len(manifest.shards) == 9 and manifest.num_samples == 80
    # sample_id alone first (the order), then every column once; no planning pass over the text before it
    assert len(scans) == 2 and scans[0] == ["sample_id"] and "text" in scans[1]


def test_row_spill_skips_long_stretches_of_other_shards_rows(tmp_path, monkeypatch) -> None:
    """A shuffled release in few large buckets spreads each shard over its whole bucket: a gather reads its rows
    and at most ``_MAX_GAP`` bytes of others between two of them, never the bucket once per shard."""
    import os

    from datahub.export import spill as spill_module

    rng = np.random.default_rng(11)
    rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(1, 2000, 2000)]
    ranks = rng.permutation(2000)
    spill = RowSpill(str(tmp_path), rows=2000, bucket_bytes=1 << 30)  # one bucket holds every row
    spill.add(ranks, pa.array(rows, pa.large_binary()))
    spill.finish()
    by_rank = {int(r): rows[i] for i, r in enumerate(ranks)}
    monkeypatch.setattr(spill_module, "_MAX_GAP", 8_000)
    read = []
    real_preadv = os.preadv

    def counting(fd, buffers, offset):  # type: ignore[no-untyped-def]
        got = real_preadv(fd, buffers, offset)
        read.append(got)
        return got

    monkeypatch.setattr(os, "preadv", counting)
    buffer = bytearray(2000 * 2000)
    wanted = 0
    for start in range(0, 2000, 100):  # 20 shards of 100 rows each, spread over the one bucket
        written = spill.gather(start, 100, memoryview(buffer))
        assert bytes(buffer[:written]) == b"".join(by_rank[r] for r in range(start, start + 100))
        wanted += written
    spill.close()
    assert wanted == sum(map(len, rows))
    assert sum(read) < 6 * wanted  # reading through the bucket per shard would be ~20x

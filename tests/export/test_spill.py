"""The local export's spill: rows appended to their key bucket in read order, gathered shard by shard in export
order; large columns read once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from datahub.errors import IntegrityError
from datahub.export import export_table_version
from datahub.export.source import TableSource
from datahub.export.spill import BucketSpill
from tests.export.helpers import cfs_storage, make_lake


def _spilled(tmp_path, rows: list[bytes], buckets: np.ndarray, count: int, batches) -> tuple[BucketSpill, np.ndarray]:
    spill = BucketSpill(str(tmp_path))
    spill.open(count)
    values = pa.array(rows, pa.large_binary())
    offsets = np.zeros(len(rows), dtype=np.int64)
    for start, end in batches:  # uneven batches, sliced arrays (offsets != 0)
        placed, sizes = spill.add(buckets[start:end], values.slice(start, end - start))
        assert sizes.tolist() == [len(r) for r in rows[start:end]]
        offsets[start:end] = placed
    spill.finish()
    return spill, offsets


def _gather(spill: BucketSpill, rows: list[bytes], buckets: np.ndarray, offsets: np.ndarray,
            wanted: np.ndarray) -> bytes:
    """Rows ``wanted`` (indices, in the wanted order) gathered back to back, bucket by bucket."""
    sizes = np.asarray([len(rows[i]) for i in wanted], dtype=np.int64)
    places = np.cumsum(sizes) - sizes
    buffer = bytearray(int(sizes.sum()) + 7)
    for bucket in sorted(set(buckets[wanted].tolist())):
        mine = buckets[wanted] == bucket
        spill.gather(bucket, offsets[wanted][mine], sizes[mine], places[mine], memoryview(buffer))
    return bytes(buffer[:int(sizes.sum())])


def test_bucket_spill_gathers_rows_into_their_places(tmp_path) -> None:
    rng = np.random.default_rng(3)
    rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 3000, 500)]
    rows[10] = b""  # an empty row
    buckets = rng.integers(0, 9, 500)
    spill, offsets = _spilled(tmp_path, rows, buckets, 9, ((0, 7), (7, 200), (200, 499), (499, 500)))
    assert len(list(tmp_path.iterdir())) == 9
    for wanted in (np.arange(500), rng.permutation(500)[:80], np.asarray([10]), np.asarray([499, 0])):
        assert _gather(spill, rows, buckets, offsets, wanted) == b"".join(rows[i] for i in wanted)
    spill.close()


def test_bucket_spill_releases_built_buckets(tmp_path) -> None:
    rng = np.random.default_rng(5)
    rows = [bytes(rng.integers(1, 256, int(n), dtype=np.uint8)) for n in rng.integers(1, 3000, 300)]
    buckets = rng.integers(0, 6, 300)
    spill, offsets = _spilled(tmp_path, rows, buckets, 6, ((0, 300),))
    for bucket in range(6):
        wanted = np.flatnonzero(buckets == bucket)
        assert _gather(spill, rows, buckets, offsets, wanted) == b"".join(rows[i] for i in wanted)
        spill.release(bucket)
        spill.finish()  # the writer thread removes it
        assert len(list(tmp_path.iterdir())) == 5 - bucket
    with pytest.raises(IntegrityError, match="after it was released"):
        _gather(spill, rows, buckets, offsets, np.flatnonzero(buckets == 0))
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
    # every column once, no planning pass over the text before it; seeded: the row count comes from the Delta log's
    # statistics (TableSource.live_rows), so no pass over sample_id either
    assert len(scans) == 1 and "text" in scans[0]
    scans.clear()
    manifest = export_table_version(lake, table="samples", version=version, release_name="rel-ids", tier="cfs",
                                    storage=cfs_storage(("cfs", tmp_path / "cfs-ids")), shard_samples=9)
    # without a seed: sample_id alone first (row count, id sample for the buckets' splitters), then every column
    assert len(scans) == 2 and scans[0] == ["sample_id"] and "text" in scans[1]


def test_bucket_spill_skips_long_stretches_of_other_shards_rows(tmp_path, monkeypatch) -> None:
    """A bucket larger than a shard holds rows of several shards, interleaved: a gather reads its rows and at most
    ``_MAX_GAP`` bytes of others between two of them, never the bucket once per shard."""
    import os

    from datahub.export import spill as spill_module

    rng = np.random.default_rng(11)
    rows = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(1, 2000, 2000)]
    buckets = np.zeros(2000, dtype=np.int64)  # one bucket holds every row
    spill, offsets = _spilled(tmp_path, rows, buckets, 1, ((0, 2000),))
    monkeypatch.setattr(spill_module, "_MAX_GAP", 8_000)
    read = []
    real_preadv = os.preadv

    def counting(fd, buffers, offset):  # type: ignore[no-untyped-def]
        got = real_preadv(fd, buffers, offset)
        read.append(got)
        return got

    monkeypatch.setattr(os, "preadv", counting)
    order = rng.permutation(2000)
    wanted = 0
    for start in range(0, 2000, 100):  # 20 shards of 100 rows each, spread over the one bucket
        rows_of_shard = order[start:start + 100]
        assert _gather(spill, rows, buckets, offsets, rows_of_shard) == b"".join(rows[i] for i in rows_of_shard)
        wanted += sum(len(rows[i]) for i in rows_of_shard)
    spill.close()
    assert wanted == sum(map(len, rows))
    assert sum(read) < 6 * wanted  # reading through the bucket per shard would be ~20x


def test_spill_buckets_hold_half_a_shard_up_to_16_mib(tmp_path, monkeypatch) -> None:
    """A local export sizes its spill buckets by its shards: half a shard, 16 MiB at most (each bucket is three
    files created and removed per export), 8 MiB at least; a bucket of a whole shard or more spans two shards, and
    each of them reads the other's rows in it."""
    import datahub.export.export as export_module
    from datahub.export.spill import bucket_bytes

    assert bucket_bytes(None) == 16 * 2**20
    assert bucket_bytes(256_000_000) == 16 * 2**20
    assert bucket_bytes(32_000_000) == 16_000_000
    assert bucket_bytes(4_000_000) == 8 * 2**20
    asked: list[int] = []
    real = export_module.bucket_count

    def bucket_count(rows, **kw):
        asked.append(kw["bucket_bytes"])
        return real(rows, **kw)

    monkeypatch.setattr(export_module, "bucket_count", bucket_count)
    lake, version = make_lake(tmp_path / "lake", 40)
    manifest = export_table_version(lake, table="samples", version=version, release_name="r", tier="cfs",
                                    storage=cfs_storage(("cfs", tmp_path / "cfs")), shard_size="64MB")
    assert asked == [16 * 2**20] and manifest.num_samples == 40


def test_record_spill_keeps_every_bucket_in_one_file_and_reads_each_once(tmp_path) -> None:
    """The plan's records go to one file (not one per bucket: a create in a busy scratch folder costs up to a ms),
    a stream per bucket and flush; a bucket reads back its rows in the order they were added, across flushes, once;
    the file goes when every bucket in it was read, and rows added after that are read as well."""
    import os

    from datahub.export.spill import RecordSpill

    rng = np.random.default_rng(5)
    spill = RecordSpill(str(tmp_path), budget=4096)  # several flushes
    buckets = rng.integers(0, 40, 3000)
    spill.add(buckets[:1000], pa.table({"row": np.arange(1000), "b": buckets[:1000]}))
    spill.add(buckets[1000:], pa.table({"row": np.arange(1000, 3000), "b": buckets[1000:]}))
    spill.flush()
    assert os.listdir(tmp_path) == ["records.arrow"]
    assert spill.read(99) is None
    for bucket in range(40):
        table = spill.read(bucket)
        assert table is not None and table.column("row").to_pylist() == np.flatnonzero(buckets == bucket).tolist()
        assert spill.read(bucket) is None  # read once
    assert os.listdir(tmp_path) == []
    spill.add(np.array([3, 3]), pa.table({"row": [7, 8], "b": [3, 3]}))
    spill.flush()
    assert spill.read(3).column("row").to_pylist() == [7, 8] and os.listdir(tmp_path) == []


def test_bucket_keys_of_one_length_are_the_ids_bytes_in_byte_order(monkeypatch) -> None:
    """Ids of one length are turned into numpy keys straight from the Arrow buffer (no Python object per id, as
    the spill's buckets and the id sample do per batch); ragged, sliced and chunked ids give the same keys and the
    same buckets as the per-id conversion."""
    import hashlib

    import pyarrow.compute as pc

    from datahub.export.plan import IdSample, KeyBuckets, _as_keys

    ids = pa.array([hashlib.sha256(str(i).encode()).hexdigest()[:32] for i in range(5000)])
    ragged = pa.array([f"id-{i}" for i in range(5000)])
    for values in (ids, ids.slice(17, 3000), pa.chunked_array([ids.slice(0, 10), ids.slice(10, 90)]), ragged,
                   ragged.slice(3, 40), pa.array(["b", "a", "c"], pa.large_string())):
        whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        reference = np.asarray(pc.cast(whole, pa.binary()).to_numpy(zero_copy_only=False).astype(bytes))
        assert _as_keys(values).tolist() == reference.tolist()
    sample = IdSample(size=500)
    sample.add(ids)
    buckets = KeyBuckets.by_sample(8, sample)
    order = np.argsort(np.asarray(ids.to_pylist(), dtype=object).astype(bytes), kind="stable")
    assert (np.diff(buckets.of(ids, None)[order]) >= 0).all()  # buckets are ranges in id order
    fast = buckets.of(ids, None).tolist()
    assert len(set(fast)) == 8
    with monkeypatch.context() as patched:  # the Python-object conversion gives the same buckets
        import datahub.export.plan as plan_module

        patched.setattr(plan_module, "_as_keys", lambda values: np.asarray(
            pc.cast(values, pa.binary()).to_numpy(zero_copy_only=False).astype(bytes)))
        assert buckets.of(ids, None).tolist() == fast

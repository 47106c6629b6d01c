"""The token export's plan (``plan_files``: key buckets sorted one at a time, files cut across them) holds one
bucket's records, whatever the size of the file it cuts: a file that spans every bucket costs the driver no more
than one that spans one."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from datahub.export.plan import sort_buckets
from datahub.export.samples import KEY_COLUMN
from datahub.export.spill import RecordSpill
from datahub.export.tokens import COUNTED, FileCuts, cut_files, plan_files, plan_records

BUCKET_ROWS = 2_000


def _counted(documents: int, seed: int) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    ids = [hashlib.sha256(f"{seed}-{i}".encode()).hexdigest() for i in range(documents)]
    lengths = rng.integers(1, 300, size=documents)
    return [pa.table([pa.array(ids[start:start + 5_000], pa.string()), pa.array(lengths[start:start + 5_000], pa.int64())],
                     schema=COUNTED) for start in range(0, documents, 5_000)]


def _held_at_each_bucket(tmp_path, monkeypatch, *, documents: int, seed: int | None, name: str):
    """The plan of ``documents`` in one file, and Arrow's allocated bytes above the first bucket's at each later
    bucket read (what the plan holds across buckets)."""
    held: list[int] = []
    real_read = RecordSpill.read

    def read(self, bucket):
        held.append(pa.total_allocated_bytes())
        return real_read(self, bucket)

    monkeypatch.setattr(RecordSpill, "read", read)
    plan = plan_files(_counted(documents, 3), shuffle_seed=seed, file_tokens=10**12, where="test",
                      directory=str(tmp_path / name), bucket_rows=BUCKET_ROWS)
    monkeypatch.setattr(RecordSpill, "read", real_read)
    return plan, [h - held[0] for h in held]


@pytest.mark.parametrize("seed", [None, 7])
def test_the_plan_of_one_file_over_many_buckets_holds_no_more_than_a_bucket(tmp_path, monkeypatch, seed) -> None:
    """One file over 4 and over 16 buckets: between bucket reads the plan holds less than a bucket's records (it held
    every document of the open file before: ~15 buckets' ids and counts at the 16th read)."""
    for documents in (4 * BUCKET_ROWS, 16 * BUCKET_ROWS):
        plan, held = _held_at_each_bucket(tmp_path, monkeypatch, documents=documents, seed=seed, name=f"p{documents}")
        assert plan.buckets >= documents // BUCKET_ROWS // 2 and len(held) == plan.buckets
        assert [(s.start, s.samples) for s in plan.spans] == [(0, documents)]
        bucket_bytes = sum(t.nbytes for _, t in plan.records()) // plan.buckets
        assert max(held) < bucket_bytes // 2, (documents, held, bucket_bytes)


@pytest.mark.parametrize("seed", [None, 7])
def test_files_cut_across_buckets_take_their_first_key_from_the_bucket_they_begin_in(tmp_path, seed) -> None:
    """Files longer than a bucket, so that a file's first document lies in an earlier bucket than its cut: the plan's
    files, first keys and tokens are those cut from the whole order in one piece."""
    counted = _counted(9 * 700, 5)
    plan = plan_files(counted, shuffle_seed=seed, file_tokens=250_000, where="test", directory=str(tmp_path / "many"),
                      bucket_rows=700)
    assert plan.buckets >= 5
    records = pa.concat_tables(r.select([KEY_COLUMN, "size"]) for r in plan_records(plan, 0, plan.num_samples))
    lengths = np.asarray(records.column("size"), dtype=np.int64)
    whole = cut_files(lengths, file_tokens=250_000)
    assert [(s.start, s.samples) for s in plan.spans] == [(s.start, s.samples) for s in whole]
    assert len(whole) > 3 and max(s.samples for s in whole) > 700  # files span buckets
    router = plan.router()
    assert router.first_ids.tolist() == [records.column(KEY_COLUMN)[s.start].as_py().encode() for s in whole]
    assert [plan.shard_member_bytes(i) for i in range(len(whole))] == \
        [int(lengths[s.start:s.start + s.samples].sum()) for s in whole]
    if seed is not None:
        assert router.first_hashes is not None
        hashes = pa.concat_arrays([r.column("order_hash").combine_chunks()
                                   for r in plan_records(plan, 0, plan.num_samples)])
        assert router.first_hashes.tolist() == [hashes[s.start].as_py() for s in whole]


def test_a_rule_that_leaves_samples_out_is_refused(tmp_path) -> None:
    """A shard rule that does not cut every sample at the last bucket is a bug, not a plan."""
    class Lazy(FileCuts):
        def feed(self, lengths, final):
            return super().feed(lengths, False)

    table = pa.table({KEY_COLUMN: pa.array(["a", "b"]), "size": pa.array([1, 2], pa.int64())})
    with pytest.raises(ValueError, match="left 2 of 2"):
        sort_buckets(lambda bucket: table, 1, directory=str(tmp_path), seeded=False, extensions=(), shard_size=None,
                     shard_samples=None, where="test", cuts=Lazy(100))


@pytest.mark.parametrize("seed", [None, 7])
def test_the_plan_read_again_is_mapped_not_copied(tmp_path, seed) -> None:
    """The token export reads the plan's records in several passes (chunks, .bin checks, .ids, .idx twice, lineage,
    digest): a bucket is memory-mapped, so a pass allocates no copy of the records it hands out."""
    plan = plan_files(_counted(6 * 700, 9), shuffle_seed=seed, file_tokens=10**12, where="test",
                      directory=str(tmp_path / "plan"), bucket_rows=700)
    assert plan.buckets >= 3
    for _ in range(2):
        before = pa.total_allocated_bytes()
        held = list(plan_records(plan, 0, plan.num_samples))
        assert sum(r.num_rows for r in held) == plan.num_samples
        assert pa.total_allocated_bytes() - before < sum(r.nbytes for r in held) // 10
        del held

"""An export in this process plans on local disk, bucket by bucket (``datahub.export.plan.BucketPlan``): with many
buckets (a tiny ``bucket_rows``) it writes the bytes, lineage and digest of a one-bucket plan and of the in-memory
plan engine exports use."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datahub.errors import IntegrityError
from datahub.export import export_table_version
from datahub.export.plan import IdSample, KeyBuckets, SizeCuts, cut_shards, cut_takes, order_hash, plan_sizes
from datahub.lake import Lake
from tests.export.helpers import cfs_storage, samples_table


def _export(lake, version, storage, tier, release="rel-v1", **kw):
    return export_table_version(lake, table="samples", version=version, release_name=release, tier=tier,
                                storage=storage, **kw)


def _lineage(lake: Lake, tier: str) -> list[tuple[str, str]]:
    rows = lake.dataset("lineage").to_table(columns=["sample_id", "ref", "run_id"]).to_pylist()
    return sorted((r["sample_id"], r["ref"]) for r in rows if r["run_id"].endswith(f"/{tier}"))


@pytest.mark.parametrize("settings", [{"shard_samples": 17}, {"shard_size": "40KB", "shuffle_seed": 7},
                                      {"shard_size": "30KB", "shard_samples": 9, "shuffle_seed": 3},
                                      {"shard_size": "64KB"}])
def test_many_buckets_write_the_bytes_lineage_and_digest_of_one(tmp_path, settings) -> None:
    lake = Lake(tmp_path / "lake")
    # three commits: the read order is not the export order, and ids of one bucket come from every file
    for part in range(3):
        version = lake.commit("samples", samples_table(70, start=70 * part, with_binary=True), txn=f"seed/{part}")
    tiers = {"one": None, "many": 7, "single_rows": 1}
    storage = cfs_storage(*((name, tmp_path / name) for name in tiers))
    manifests = {name: _export(lake, version, storage, name, release=f"rel-{name}", bucket_rows=rows, **settings)
                 for name, rows in tiers.items()}
    shards = {name: [(s.samples, s.size, s.sha256) for s in m.shards] for name, m in manifests.items()}
    assert shards["many"] == shards["one"] == shards["single_rows"] and len(shards["one"]) > 3
    assert len({m.release_digest for m in manifests.values()}) == 1
    for name, manifest in manifests.items():
        for shard in manifest.shards:
            data = Path(shard.replicas[name]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard.sha256
    members = {name: [ref.split('"member": ')[1] for _, ref in _lineage(lake, name)] for name in tiers}
    assert members["one"] == members["many"] == members["single_rows"] and len(members["one"]) == 210

    # the in-memory plan (engine exports) orders and cuts the same: compare the samples per shard and first ids
    ids = pa.array(samples_table(210)["sample_id"].to_pylist(), pa.string())
    seed = settings.get("shuffle_seed")
    if seed is None:
        expected = sorted(ids.to_pylist())
    else:
        hashes = order_hash(ids, seed)
        expected = [i for _, i in sorted(zip(hashes.tolist(), ids.to_pylist()))]
    shard_members = [ref for _, ref in _lineage(lake, "many")]
    assert sorted(r.split('"member": "')[1][:-6] for r in shard_members) == sorted(expected)
    assert manifests["many"].num_samples == 210


def test_cut_in_pieces_cuts_the_shards_of_the_whole() -> None:
    rng = np.random.default_rng(5)
    for shard_size, shard_samples in ((40_000, None), (None, 13), (25_000, 7), (10_240, None)):
        sizes = rng.integers(1024, 9000, size=900).astype(np.int64)
        whole = [s.samples for s in cut_shards(sizes, shard_size=shard_size, shard_samples=shard_samples)]
        cuts = sorted(rng.choice(np.arange(1, 900), size=30, replace=False).tolist()) + [900]
        pieces, pending, begin = [], np.zeros(0, np.int64), 0
        for end in cuts:
            pending = np.concatenate([pending, sizes[begin:end]])
            takes = cut_takes(pending, shard_size=shard_size, shard_samples=shard_samples, final=end == 900)
            pieces += takes
            pending = pending[sum(takes):]
            begin = end
        assert pieces == whole and sum(whole) == 900
        rule, begin, fed = SizeCuts(shard_size=shard_size, shard_samples=shard_samples), 0, []
        for end in cuts:  # the rule sort_buckets feeds: it holds the pending sizes itself
            fed += rule.feed(sizes[begin:end], end == 900)
            begin = end
        starts = np.cumsum([0] + whole)
        assert fed == [(take, int(sizes[start:start + take].sum())) for start, take in zip(starts, whole)]


def test_key_buckets_follow_export_order() -> None:
    ids = pa.array([hashlib.sha256(str(i).encode()).hexdigest()[:(i % 20) + 5] for i in range(5000)], pa.string())
    sample = IdSample(size=300)
    for start in range(0, 5000, 700):
        sample.add(ids.slice(start, 700))
    by_id = KeyBuckets.by_sample(16, sample)
    buckets = by_id.of(ids, None)
    ordered = np.argsort(np.asarray(ids.to_pylist(), dtype=object).astype(bytes), kind="stable")
    assert np.all(np.diff(buckets[ordered]) >= 0) and len(set(buckets.tolist())) == 16
    assert max(np.bincount(buckets)) < 3 * 5000 / 16  # a sample's quantiles: buckets of about equal size
    hashes = order_hash(ids, 11)
    by_hash = KeyBuckets.by_hash(16).of(ids, hashes)
    assert np.all(np.diff(by_hash[np.argsort(hashes)]) >= 0) and len(set(by_hash.tolist())) == 16


@pytest.mark.parametrize("seed", [None, 4])
def test_repeated_ids_are_refused_through_many_buckets(tmp_path, seed) -> None:
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    lake = Lake(tmp_path / "dup")
    table = samples_table(60)
    lake.commit("samples", table, txn="a")
    version = lake.commit("samples", table.slice(41, 1), txn="b")  # one id again, in another file
    with pytest.raises(IntegrityError, match=r"not unique \(61 rows, 60 distinct ids\)"):
        _export(lake, version, storage, "cfs", shard_samples=5, shuffle_seed=seed, bucket_rows=3)
    assert not list((tmp_path / "cfs").rglob("*.tar"))


def test_plan_in_memory_and_on_disk_agree_on_spans(tmp_path) -> None:
    """The engines' in-memory plan (``plan_sizes``) and the bucketed one cut at the same ranks."""
    lake = Lake(tmp_path / "lake")
    version = lake.commit("samples", samples_table(150), txn="seed")
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    manifest = _export(lake, version, storage, "cfs", shard_size="20KB", shuffle_seed=9, bucket_rows=10)
    from datahub.export.export import SizesReader
    from datahub.export.source import TableSource

    source = TableSource(lake, "samples", version)
    reader = SizesReader.of(source)
    tables = [reader.sizes(b) for b in source.scan(reader.projection())]
    plan = plan_sizes([t.column("sample_id").combine_chunks() for t in tables],
                      [np.asarray(t.column("size")) for t in tables], shuffle_seed=9, shard_size=20_000,
                      shard_samples=None, where="t")
    assert [s.samples for s in plan.spans] == [s.samples for s in manifest.shards]


@pytest.mark.parametrize("seeded", [False, True])
def test_a_plan_keeps_its_sorted_buckets_in_one_file(tmp_path, seeded) -> None:
    """sort_buckets writes every bucket's sorted records into one file (a create in a busy scratch folder costs up to
    a ms, and a plan has hundreds of buckets), read back bucket by bucket in export order, with each shard's first key
    read back from an earlier bucket where the shard began there."""
    import os

    from datahub.export.plan import sort_buckets
    from datahub.export.spill import RecordSpill

    rng = np.random.default_rng(3)
    ids = pa.array([f"{x:016x}" for x in rng.permutation(2000)], pa.string())
    hashes = order_hash(ids, 11) if seeded else None
    buckets = KeyBuckets.by_hash(37) if seeded else KeyBuckets(37, np.sort(np.asarray(ids.to_pylist()[:36],
                                                                                      dtype=object)).astype(bytes))
    records = RecordSpill(str(tmp_path))
    columns = {"sample_id": ids, "size": pa.array(rng.integers(600, 3000, 2000), pa.int64())}
    if seeded:
        columns["order_hash"] = pa.array(hashes, pa.uint64())
    records.add(buckets.of(ids, hashes), pa.table(columns))
    records.flush()
    plan = sort_buckets(records.read, 37, directory=str(tmp_path), seeded=seeded, extensions=(), shard_size=20_000,
                        shard_samples=None, where="t")
    assert os.listdir(tmp_path) == ["sorted.arrow"]
    keys = [("order_hash", "ascending"), ("sample_id", "ascending")] if seeded else [("sample_id", "ascending")]
    expected = pa.table(columns).sort_by(keys).column("sample_id").to_pylist()
    assert [i for chunk in plan.id_chunks() for i in chunk.to_pylist()] == expected
    assert len(plan.spans) > 37 // 4 and plan.router().first_ids.astype(str).tolist() == \
        [expected[s.start] for s in plan.spans]

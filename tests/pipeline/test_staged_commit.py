"""The streaming sink's commits: staged rows become table files one row group at a time.

Lineage is staged in 16 sample_id ranges and committed sorted, so every lineage file covers
its own range (the layout Spark's executors give it); samples files are copied in the table's
schema and committed as add actions, with the run id as app transaction (a repeat is a no-op).
"""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datahub.errors import LakeError
from datahub.lake import Lake
from datahub.lake.lake import SORTED_LAYOUT
from datahub.pipeline.sinks.staging import StagedRows, range_buckets


def _staged(folder, name: str) -> StagedRows:
    folder.mkdir()
    return StagedRows(str(folder), name)


def _rows(rng: random.Random, n: int) -> pa.Table:
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(n)]
    return pa.table({"sample_id": ids, "event": ["ingested"] * n, "n": list(range(n))})


def test_range_buckets_follow_string_order():
    values = pa.array(["0", "0f", "1", "9zz", "a", "ab", "f", "ffff", "g", "Z", None, ""])
    buckets = range_buckets(values).tolist()
    assert buckets == [0, 0, 1, 9, 10, 10, 15, 15, 15, 9, 0, 0]  # "g" sorts after "f", "Z" between "9" and "a"
    ordered = sorted(v for v in values.to_pylist() if v is not None)
    ranks = {v: b for v, b in zip(values.to_pylist(), buckets) if v is not None}
    assert [ranks[v] for v in ordered] == sorted(ranks[v] for v in ordered)


def test_lineage_commit_is_range_sorted_in_small_row_groups(tmp_path):
    rng = random.Random(3)
    staged = _staged(tmp_path / "staging", "lineage")
    batches = [_rows(rng, n) for n in (5000, 70_000, 1, 20_000)]
    for batch in batches:
        staged.write(batch)
    staged.close()
    lake = Lake(tmp_path / "lake")
    version = staged.commit(lake, "lineage", txn="run-1")
    assert version is not None and staged.commit(lake, "lineage", txn="run-1") is None  # idempotent

    column, group_rows = SORTED_LAYOUT["lineage"]
    files = sorted(u.removeprefix("file://") for u in lake.table("lineage").file_uris())
    assert len(files) == 16
    ranges = []
    for uri in files:
        ids = pq.read_table(uri, columns=[column]).column(column).to_pylist()
        assert ids == sorted(ids)
        metadata = pq.ParquetFile(uri).metadata
        assert max(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)) <= group_rows
        ranges.append((ids[0], ids[-1]))
    ranges.sort()
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    expected = pa.concat_tables(batches)
    assert sorted(lake.read("lineage").column("sample_id").to_pylist()) == sorted(expected.column("sample_id").to_pylist())


def test_samples_commit_streams_files_into_the_table_and_replace_still_overwrites(tmp_path):
    rng = random.Random(4)
    lake = Lake(tmp_path / "lake")
    first = _staged(tmp_path / "s1", "samples")
    rows = _rows(rng, 3000)
    for i in range(0, 3000, 700):
        first.write(rows.slice(i, 700))
    first.close()
    assert first.commit(lake, "samples", txn="run-1") is not None
    assert lake.applied("samples", "run-1")
    assert sorted(lake.read("samples").column("n").to_pylist()) == list(range(3000))
    files = lake.table("samples").file_uris()
    assert len(files) == 1 and pq.ParquetFile(files[0].removeprefix("file://")).metadata.num_row_groups == 5

    second = _staged(tmp_path / "s2", "samples")
    second.write(_rows(rng, 10).append_column("extra", pa.array(["x"] * 10)))  # a new column: merged into the table
    second.close()
    second.commit(lake, "samples", txn="run-2")
    table = lake.read("samples")
    assert table.num_rows == 3010 and table.column("extra").null_count == 3000

    replace = _staged(tmp_path / "s3", "samples")
    replace.write(_rows(rng, 4))
    replace.close()
    replace.commit(lake, "samples", txn="run-3", replace="n >= 0")  # --full: a predicate overwrite, streamed
    assert lake.read("samples").num_rows == 4


def test_rows_that_do_not_fit_the_table_name_it(tmp_path):
    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["a"], "n": pa.array([{"x": 1}])}), txn="hand-made")
    staged = _staged(tmp_path / "s", "samples")
    staged.write(pa.table({"sample_id": ["b"], "n": [1]}))
    staged.close()
    with pytest.raises(LakeError, match=r"samples: the run's rows do not fit the table's schema .*\bn\b"):
        staged.commit(lake, "samples", txn="run-1")
    assert lake.read("samples").num_rows == 1


def test_filters_on_long_strings_find_rows_of_committed_files(tmp_path):
    """File stats bound long strings by a 32-char prefix (and the prefix + U+10FFFF above): a filter
    on such a column still finds the file (a missing bound made delta-rs prune it)."""
    import pyarrow.dataset as ds

    uris = ["/data/" + "x" * 60 + "/part-0001.jsonl", "/data/" + "x" * 60 + "/part-0002.jsonl"]
    staged = _staged(tmp_path / "s", "quarantine")
    staged.write(pa.table({"source_uri": uris, "source_offset": [1, 2]}))
    staged.close()
    lake = Lake(tmp_path / "lake")
    staged.commit(lake, "quarantine", txn="run-1")
    found = lake.read("quarantine", filters=ds.field("source_uri") == uris[1])
    assert found.column("source_offset").to_pylist() == [2]
    [action] = pa.table(lake.table("quarantine").get_add_actions(flatten=True)).to_pylist()
    low, high = action["min.source_uri"], action["max.source_uri"]
    assert len(low) == 32 and low <= min(uris) and max(uris) < high


def test_sink_split_in_slices_gives_the_tables_of_whole_batches(tmp_path, monkeypatch):
    """The streaming sink splits a batch ``SINK_SLICE_ROWS`` rows at a time: the same samples, lineage and
    quarantine as one split per batch (a broken record among them)."""
    from datahub.config.spec import validate_job_spec
    from datahub.engines.arrow import ArrowEngine
    from datahub.pipeline.sinks import samples as sinks
    from datahub.pipeline.run import run_job
    from tests.pipeline.corpus import job_raw, make_corpus

    corpus = make_corpus(tmp_path / "in", files=2, per_file=15)

    def tables(lake_dir):
        run_job(validate_job_spec(job_raw(corpus, lake_dir)), engine=ArrowEngine(batch_size=64))
        lake = Lake(lake_dir)
        lineage = lake.read("lineage")
        return (sorted(lake.read("samples").column("sample_id").to_pylist()),
                sorted(zip(*(lineage.column(c).to_pylist() for c in ("sample_id", "op", "action", "reason")))),
                sorted(lake.read("quarantine").column("reason").to_pylist()))

    whole = tables(tmp_path / "whole")
    monkeypatch.setattr(sinks, "SINK_SLICE_ROWS", 4)
    sliced = tables(tmp_path / "sliced")
    assert sliced == whole
    assert len(whole[0]) == 30 + 1 and whole[2]  # the broken file's good record, and its bad line quarantined

"""Reading the lake's dedup indexes (``operators.dedup.index``).

An incremental dedup run reads the lake's dedup indexes on the engine, keeping only the rows a new sample can
match: before, ``read_index`` read the whole ``minhash_index`` and ``exact_index`` (every band of every lake
sample) into the driver on every run, so a scheduled job's memory grew with the lake, not with its new input.

The job runs in a subprocess on the in-process Arrow engine (driver = engine): whatever it holds, it holds in
that one Arrow memory pool, measured without timing, threads or core counts."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from tests.operators.dedup.conftest import edit_words, make_corpus

REPO = Path(__file__).resolve().parents[3]
LAKE_SAMPLES = 40_000  # synthetic samples of earlier runs in the indexes (other jobs, same params)
BANDS = 25  # minhash_index rows per synthetic sample: 1M band rows, ~100 MB as Arrow

PEAK = """
import json, os, sys
import pyarrow as pa
from datahub.config.spec import validate_job_spec
from datahub.engines.arrow import ArrowEngine
from datahub.lake import Lake
from datahub.pipeline.run import run_job
spec = validate_job_spec(json.loads(sys.argv[1]))
before = pa.default_memory_pool().max_memory()
result = run_job(spec, engine=ArrowEngine())
peak = pa.default_memory_pool().max_memory() - before
lake = Lake(spec.lake.root)
index_bytes = {t: lake.dataset(t).to_table(columns=c).nbytes for t, c in
               (("minhash_index", ["sample_id", "band_key", "run_id"]), ("exact_index", ["content_hash", "sample_id", "run_id"]))}
print(json.dumps({"status": result.status, "error": result.error, "run_id": result.run_id, "peak": peak,
                  "index_bytes": index_bytes}))
sys.stdout.flush()
os._exit(0)
"""


def _hex(rng: np.random.Generator, n: int, width: int) -> pa.Array:
    raw = rng.integers(0, 256, size=(n, width // 2), dtype=np.uint8)
    return pa.array([row.tobytes().hex() for row in raw], pa.string())


def _grow_indexes(lake: Lake, rows: int, bands: int) -> None:
    """Index rows of ``rows`` synthetic samples kept by another job's earlier runs, with the job's params hash."""
    rng = np.random.default_rng(7)
    for table, txn in (("minhash_index", "grow-minhash"), ("exact_index", "grow-exact")):
        params_hash = lake.read(table, columns=["params_hash"]).column("params_hash")[0].as_py()
        ids = _hex(rng, rows, 64)
        if table == "minhash_index":
            data = pa.table({"sample_id": pa.array(np.repeat(ids.to_numpy(zero_copy_only=False), bands), pa.string()),
                             "band_key": pa.array(rng.integers(-2**62, 2**62, rows * bands), pa.int64())})
        else:
            data = pa.table({"content_hash": _hex(rng, rows, 32), "sample_id": ids})
        n = data.num_rows
        data = data.append_column("params_hash", pa.array([params_hash] * n, pa.string())).append_column(
            "run_id", pa.array(["older-job-0123456789ab"] * n, pa.string()))
        lake.commit(table, data, txn=txn, row_group_rows=65_536)  # as a run's side outputs are cut


def test_incremental_dedup_does_not_hold_the_lakes_index(tmp_path):
    rng = random.Random(3)
    originals = make_corpus(30, seed=11)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in originals))
    raw = {"name": "mem", "lake": {"root": str(tmp_path / "lake")}, "inputs": [{"uri": str(inputs / "*.jsonl")}],
           "graph": {"exact": {"op": "exact_dedup"},
                     "near": {"op": "minhash_dedup", "after": ["exact"], "params": {"threshold": 0.5, "verify": True}},
                     "samples": {"sink": "samples", "after": ["near"]}}}
    spec = validate_job_spec(raw)
    assert run_job(spec, engine=ArrowEngine()).status == "succeeded"
    lake = Lake(tmp_path / "lake")
    ids = {row["text"]: row["sample_id"] for row in lake.read("samples", columns=["sample_id", "text"]).to_pylist()}
    _grow_indexes(lake, LAKE_SAMPLES, BANDS)

    fresh = make_corpus(5, seed=12)
    near = edit_words(originals[0], 0.03, rng)
    (inputs / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in [*fresh, near, originals[1]]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PEAK, json.dumps(raw)], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["status"] == "succeeded", measured

    # the decisions against the lake stand: the copy and the near copy are dropped for the lake's samples
    lineage = lake.read("lineage", columns=["sample_id", "run_id", "action", "reason", "ref"]).to_pylist()
    dropped = {(r["reason"], json.loads(r["ref"])["dup_of"]) for r in lineage
               if r["run_id"] == measured["run_id"] and r["action"] == "dropped"}
    assert dropped == {("exact_duplicate", ids[originals[1]]), ("near_duplicate", ids[originals[0]])}, dropped
    kept = lake.read("samples", columns=["ingest_run_id"]).column("ingest_run_id").to_pylist().count(measured["run_id"])
    assert kept == len(fresh)

    # The minhash index is ~100 MB as Arrow (1M band rows), the exact index ~5 MB. Before, the run read both whole
    # into the driver: peak 205 MB. Now its tasks scan 2,048-row batches and keep the few matching rows: 10.4 MB
    # (1.5 MB without the grown indexes). Bound ~25 MB: 2.4x the new peak, 8x under the old one.
    assert measured["peak"] < measured["index_bytes"]["minhash_index"] / 4, measured



# ---- read_index / lake_rows_of on small lakes (direct calls, Arrow engine) ----------------------------------

OWN_RUN = "common-crawl-2024-10-ingest-0123456789ab"  # > 32 characters: its files' run_id statistics are truncated
PARAMS = "0123456789abcdef"


def _context(lake: Lake, engine: ArrowEngine, run_id: str = OWN_RUN):
    import types

    return types.SimpleNamespace(lake=lake, run_id=run_id, full=False, job_name=run_id.rsplit("-", 1)[0],
                                 read_files=engine.read_files, from_arrow=engine.from_arrow)


def _commit_with_stats(lake: Lake, table: str, data: pa.Table, txn: str) -> None:
    """One file committed with the statistics the engines' writers record (``FileStats``: long strings truncated)."""
    import pyarrow.parquet as pq

    from datahub.lake.add_actions import DataFile, commit_files
    from datahub.lake.files import FileStats

    folder = Path(lake.table_uri(table))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{txn}.parquet"
    pq.write_table(data, path)
    stats = FileStats(data.schema)
    stats.update(data)
    commit_files(lake, table, [DataFile(uri=str(path), size=path.stat().st_size, rows=data.num_rows,
                                        stats=stats.to_json())], schema=data.schema, txn=txn)


def test_a_resumed_run_whose_own_index_rows_are_all_the_scan_finds_reads_no_match_either_way(tmp_path, monkeypatch):
    """A run killed after committing its index rows is resumed with the same run id. Its run id is longer than the
    statistics keep, so its own file is not pruned, and the scan tasks find no row of another run. With the new keys
    hash-joined (more than ``BROADCAST_ROWS``), the Arrow engine's frame of no rows had no columns: the join raised
    ``KeyError: Field "band_key" does not exist``. Either way: no match."""
    import operators.dedup.index as index
    from operators.dedup.index import MINHASH_INDEX_SCHEMA, read_index

    lake = Lake(tmp_path / "lake")
    own = pa.table({"sample_id": ["s1", "s2"], "band_key": pa.array([1, 2], pa.int64()), "params_hash": [PARAMS] * 2,
                    "run_id": [OWN_RUN] * 2}, schema=MINHASH_INDEX_SCHEMA)
    _commit_with_stats(lake, "minhash_index", own, OWN_RUN)
    engine = ArrowEngine()
    for limit in (index.BROADCAST_ROWS, 0):  # pushed to the tasks, hash-joined
        monkeypatch.setattr(index, "BROADCAST_ROWS", limit)
        keys = engine.from_arrow(pa.table({"band_key": pa.array([1, 2, 3], pa.int64())}))
        assert read_index(_context(lake, engine), "minhash_index", columns=["sample_id", "band_key"],
                          params_hash=PARAMS, among=("band_key", keys)) is None, limit


def _flaky_dataset(monkeypatch, fail_at: set[int]) -> dict[str, int]:
    """``Lake.dataset`` raises a connection reset (a radosgw restart) on the calls numbered in ``fail_at``."""
    real = Lake.dataset
    calls = {"n": 0}

    def dataset(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] in fail_at:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Lake, "dataset", dataset)
    return calls


def test_a_transient_storage_error_while_the_index_or_the_lake_texts_are_read_is_retried(tmp_path, monkeypatch):
    """Before, ``Lake.read`` retried a transient storage error (``lake.retry``, ~40 s of patience); the index scan
    and ``lake_rows_of`` call ``lake.dataset`` and ``scan_batches`` directly, and one connection reset failed the
    run. Each place the table is opened fails once here: the driver's listing, the scan task, ``lake_rows_of``."""
    import operators.dedup.index as index
    from datahub.retry import RetryPolicy
    from operators.dedup.index import MINHASH_INDEX_SCHEMA, lake_rows_of, read_index

    lake = Lake(tmp_path / "lake")
    lake.commit("minhash_index", pa.table({"sample_id": ["s1"], "band_key": pa.array([1], pa.int64()),
                                           "params_hash": [PARAMS], "run_id": ["other-0123456789ab"]},
                                          schema=MINHASH_INDEX_SCHEMA), txn="x")
    lake.commit("samples", pa.table({"sample_id": ["s1", "s2"], "text": ["one", "two"]}), txn="y")
    lake.retry = RetryPolicy(attempts=3, backoff=0.01)
    engine = ArrowEngine()
    for limit in (index.BROADCAST_ROWS, 0):
        monkeypatch.setattr(index, "BROADCAST_ROWS", limit)
        for fail_at in ({1}, {2}):  # 1: read_index's listing in the driver, 2: the scan task
            calls = _flaky_dataset(monkeypatch, fail_at)
            keys = engine.from_arrow(pa.table({"band_key": pa.array([1, 5], pa.int64())}))
            found = read_index(_context(lake, engine), "minhash_index", columns=["sample_id", "band_key"],
                               params_hash=PARAMS, among=("band_key", keys))
            assert found is not None and found[0].to_arrow().column("sample_id").to_pylist() == ["s1"]
            assert calls["n"] >= 3, calls  # the failed call was made and retried
    calls = _flaky_dataset(monkeypatch, {1})
    texts = lake_rows_of(lake, "samples", ["sample_id", "text"], pa.array(["s2"]))
    assert texts.to_pylist() == [{"sample_id": "s2", "text": "two"}]
    assert calls["n"] == 2, calls


def test_an_index_file_deleted_under_the_scan_names_the_vacuum(tmp_path):
    """A data file of the index's version is gone (``datahub release vacuum``, or by hand): the error says so, as
    ``Lake.read`` did, not a bare FileNotFoundError from a task."""
    import pytest

    from datahub.errors import LakeError
    from operators.dedup.index import MINHASH_INDEX_SCHEMA, lake_rows_of, read_index

    lake = Lake(tmp_path / "lake")
    lake.commit("minhash_index", pa.table({"sample_id": ["s1"], "band_key": pa.array([1], pa.int64()),
                                           "params_hash": [PARAMS], "run_id": ["other-0123456789ab"]},
                                          schema=MINHASH_INDEX_SCHEMA), txn="x")
    lake.commit("samples", pa.table({"sample_id": ["s1"], "text": ["one"]}), txn="y")
    for table in ("minhash_index", "samples"):
        for path in Path(lake.table_uri(table)).glob("*.parquet"):
            path.unlink()
    engine = ArrowEngine()
    keys = engine.from_arrow(pa.table({"band_key": pa.array([1], pa.int64())}))
    with pytest.raises(LakeError, match="vacuum"):
        read_index(_context(lake, engine), "minhash_index", columns=["sample_id", "band_key"], params_hash=PARAMS,
                   among=("band_key", keys))
    with pytest.raises(LakeError, match="vacuum"):
        lake_rows_of(lake, "samples", ["sample_id", "text"], pa.array(["s1"]))


def test_the_pushed_key_set_keeps_exactly_the_rows_is_in_keeps():
    """``KeySet`` (the pushed keys sorted once in the driver, each batch binary-searched) keeps exactly the rows
    ``pc.is_in`` keeps, for int64 band keys and string content hashes, with nulls (never a match), values longer or
    shorter than every key, prefixes of keys, NUL bytes and non-ASCII text; and a key set of one value or none."""
    from operators.dedup.index import KeySet

    rng = np.random.default_rng(3)
    ints = rng.integers(-2**62, 2**62, 5_000)
    keys = pa.array(np.concatenate([ints[:2_000], [-2**63, 2**63 - 1, 0]]), pa.int64())
    column = pa.array([*ints[1_000:4_000].tolist(), None, -2**63, 2**63 - 1, 0, 1, -1], pa.int64())
    hexes = [f"{int(v) & (2**64 - 1):016x}{int(v) & (2**32 - 1):016x}" for v in ints]
    odd = ["", "a", "ab", "abc", "a\x00", "a\x00\x00", "\x00", "é", "ée", "e", "a\x01", "ab\x01", "日本"]
    string_keys = pa.array([*hexes[:2_000], *odd[::2]], pa.string())
    strings = pa.array([*hexes[1_000:4_000], *odd, None, hexes[0][:-1], hexes[0] + "0", hexes[0] + "\x01"], pa.string())
    cases = [(keys, column), (string_keys, strings), (pa.array([5], pa.int64()), column),
             (pa.array([], pa.int64()), column), (pa.array(["a"], pa.string()), strings),
             (pa.array([], pa.string()), strings), (string_keys.cast(pa.large_string()), strings.cast(pa.large_string())),
             (pa.array([1.5, 2.0]), pa.array([1.5, None, 3.0]))]
    for values, col in cases:
        expected = pc_is_in(col, values)
        got = KeySet.of(values).contains(col).to_pylist()
        assert got == expected, (values.type, [(v, e) for v, g, e in zip(col.to_pylist(), got, expected) if g != e][:5])
        assert sum(expected) > 0 or len(values) == 0 or values.to_pylist() == [5]


def pc_is_in(column: pa.Array, values: pa.Array) -> list[bool]:
    import pyarrow.compute as pc

    return pc.is_in(column, value_set=values, skip_nulls=True).to_pylist()


def test_the_lake_texts_of_a_few_samples_walk_the_tables_files_once(tmp_path, monkeypatch):
    """``lake_rows_of`` (minhash verify's lake texts) scanned each ``samples`` file with ``scan_batches(files=[it])``,
    which walks every file of the table to find it: files x files fragment visits (8 s at 2,000 files). Counted
    here: the fragments the table's dataset hands out, for a table of 40 one-row files."""
    import pyarrow.parquet as pq

    from datahub.lake.add_actions import DataFile, commit_files
    from datahub.lake.files import FileStats
    from operators.dedup.index import lake_rows_of

    files = 40
    lake = Lake(tmp_path / "lake")
    folder = Path(lake.table_uri("samples"))
    folder.mkdir(parents=True)
    schema = pa.schema([("sample_id", pa.string()), ("text", pa.string())])
    written = []
    for i in range(files):
        data = pa.table({"sample_id": [f"{i:032x}"], "text": [f"text {i}"]}, schema=schema)
        path = folder / f"f{i}.parquet"
        pq.write_table(data, path)
        stats = FileStats(schema)
        stats.update(data)
        written.append(DataFile(uri=str(path), size=path.stat().st_size, rows=1, stats=stats.to_json()))
    commit_files(lake, "samples", written, schema=schema, txn="t")

    visits = {"n": 0}
    real = Lake.dataset

    class Counting:
        def __init__(self, dataset):
            self.dataset = dataset

        def __getattr__(self, name):
            return getattr(self.dataset, name)

        def get_fragments(self, *args, **kwargs):
            for fragment in self.dataset.get_fragments(*args, **kwargs):
                visits["n"] += 1
                yield fragment

    monkeypatch.setattr(Lake, "dataset", lambda self, *a, **k: Counting(real(self, *a, **k)))
    wanted = pa.array([f"{7:032x}", f"{31:032x}", "absent"])
    rows = lake_rows_of(lake, "samples", ["sample_id", "text"], wanted)
    assert sorted(rows.column("text").to_pylist()) == ["text 31", "text 7"]
    assert visits["n"] <= 2 * files, visits  # before: 1,680 (41 walks of 40 files)


def test_index_rows_without_a_run_id_are_never_matched(tmp_path):
    """One rule for a null ``run_id`` (``IndexRows`` never writes one): such rows are no run's and are not matched,
    as before the scan moved to the engine (the row filter dropped nulls) and as file pruning treats a file of them.
    The scan kept them when a file also held another run's rows (reviewer-dedup39 #6)."""
    from operators.dedup.index import MINHASH_INDEX_SCHEMA, read_index

    lake = Lake(tmp_path / "lake")
    lake.commit("minhash_index", pa.table({"sample_id": ["s1", "s2"], "band_key": pa.array([1, 2], pa.int64()),
                                           "params_hash": [PARAMS] * 2, "run_id": ["other-0123456789ab", None]},
                                          schema=MINHASH_INDEX_SCHEMA), txn="x")
    engine = ArrowEngine()
    keys = engine.from_arrow(pa.table({"band_key": pa.array([1, 2], pa.int64())}))
    found = read_index(_context(lake, engine), "minhash_index", columns=["sample_id", "band_key"], params_hash=PARAMS,
                       among=("band_key", keys))
    assert found is not None
    assert found[0].to_arrow().column("sample_id").to_pylist() == ["s1"]
    assert found[1].to_arrow().column("sample_id").to_pylist() == ["s1"]


def test_the_lake_texts_lookup_retries_a_failed_read_of_the_tables_log(tmp_path, monkeypatch):
    """``lake_rows_of`` read the table's version (its Delta log) outside the retry: one connection reset there
    escaped as a bare ConnectionResetError, where ``Lake.read`` retries it (reviewer-dedup39b #1)."""
    from datahub.retry import RetryPolicy
    from operators.dedup.index import lake_rows_of

    lake = Lake(tmp_path / "lake")
    lake.commit("samples", pa.table({"sample_id": ["s1", "s2"], "text": ["one", "two"]}), txn="y")
    lake.retry = RetryPolicy(attempts=3, backoff=0.01)
    real = Lake.table
    calls = {"n": 0}

    def table(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Lake, "table", table)
    assert lake_rows_of(lake, "samples", ["sample_id", "text"], pa.array(["s2"])).to_pylist() == [
        {"sample_id": "s2", "text": "two"}]
    assert calls["n"] >= 2


def test_wide_string_keys_are_not_padded_to_the_longest(tmp_path):
    """Fixed-width search pads every key to the longest: 100k keys and one of 100 KB would take 10 GB. Keys that
    wide are searched by ``pc.is_in`` instead, with the same answers."""
    from operators.dedup.index import MAX_KEY_BYTES, KeySet

    keys = pa.array([f"{i:032x}" for i in range(1_000)] + ["w" * (MAX_KEY_BYTES + 1)], pa.string())
    column = pa.array(["w" * (MAX_KEY_BYTES + 1), f"{7:032x}", "nope", None], pa.string())
    wide = KeySet.of(keys)
    assert wide.sorted_keys is None  # not padded
    assert wide.contains(column).to_pylist() == pc_is_in(column, keys) == [True, True, False, False]
    assert KeySet.of(keys[:1_000]).sorted_keys is not None  # content hashes stay on the binary search

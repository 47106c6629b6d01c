"""An engine's token export writes a file a chunk of its export order at a time, as the local export does: Ray's
write task gathers one chunk of the sorted runs after the other, Spark's streams the batches of its sorted rows, and
the files (and the manifest's sizes and sha256s) are the bytes of a local export whatever the chunk, the batch and
the number of workers. The writer is measured in the engines' own tasks: no batch it is handed holds more than a
chunk (a document larger than one alone), and Arrow's memory does not grow from batch to batch of a file."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.engines.sink import Sink
from datahub.export import tokens
from datahub.export.tokens import CHUNK_DOCUMENT_BYTES, TokenFileDone, TokenFileWriter, export_table_tokens
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.export.helpers import cfs_storage
from tests.export.test_tokens import expected, make_lake, read_all, train_tokenizer

pytest.importorskip("tokenizers")

CHUNK = 300  # routed bytes of a chunk: one to three documents of the test lake


def _routed_bytes(batch: pa.Table) -> int:
    """What ``plan_chunks`` counts of a batch: its tokens' and ids' bytes, and ``CHUNK_DOCUMENT_BYTES`` a document."""
    tokens_bytes = int(pc.sum(pc.binary_length(batch.column("tokens"))).as_py() or 0)
    id_bytes = int(pc.sum(pc.binary_length(batch.column("sample_id"))).as_py() or 0)
    return tokens_bytes + id_bytes + CHUNK_DOCUMENT_BYTES * batch.num_rows


@dataclass(frozen=True)
class MeasuredWriter(TokenFileWriter):
    """The token export's sink, noting in ``log`` (a folder) per file what each batch handed to its task held and
    Arrow's allocated bytes when each batch arrived (pickled by reference to the engines' tasks)."""

    log: str = ""

    def write(self, batches: Any) -> TokenFileDone:
        seen: list[dict[str, int]] = []

        def measured() -> Any:
            for batch in batches:
                seen.append({"rows": batch.num_rows, "bytes": _routed_bytes(batch),
                             "allocated": pa.total_allocated_bytes()})
                yield batch
                del batch

        done = super().write(measured())
        with open(os.path.join(self.log, f"{done.index:06d}-{os.getpid()}.json"), "w") as out:
            json.dump({"index": done.index, "documents": done.documents, "batches": seen}, out)
        return done


def _logged(folder: Path) -> dict[int, dict[str, Any]]:
    files = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return {f["index"]: f for f in files}


def _same_bytes(local, other, local_tier: str, other_tier: str) -> None:
    assert [f.prefix for f in local.files] == [f.prefix for f in other.files]
    for one, two in zip(local.files, other.files, strict=True):
        for suffix in ("bin", "idx", "ids"):
            assert Path(two.replicas[other_tier] + "." + suffix).read_bytes() == \
                Path(one.replicas[local_tier] + "." + suffix).read_bytes()
            assert (one.part(suffix).size, one.part(suffix).sha256) == (two.part(suffix).size, two.part(suffix).sha256)
    assert local.release_digest == other.release_digest


@pytest.mark.parametrize(("file_tokens", "seed"), [(10**6, 5), (400, None)])
def test_ray_writes_a_file_a_chunk_at_a_time_the_bytes_of_a_local_export(tmp_path, monkeypatch, ray_engine,
                                                                         file_tokens, seed) -> None:
    """Chunks of one to three documents (``chunk_bytes`` 300): with one file of every document, or files of ~400
    tokens, on 1 and on 2 workers, every batch a write task gets is one chunk (at most ``chunk_bytes`` routed, or a
    single larger document), a file comes in as many batches as the plan has chunks, Arrow's memory at a file's last
    batch is within a few chunks of its first, and the bytes are a local export's. Before, a task was handed its
    whole file in one table (one batch of ~150 documents here)."""
    lake, version = make_lake(tmp_path / "lake", 150)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("local", tmp_path / "local"), ("ray1", tmp_path / "ray1"), ("ray2", tmp_path / "ray2"))
    made: list[tokens.FileChunks] = []
    real_plan_chunks = tokens.plan_chunks

    def recorded(*args: Any, **kwargs: Any) -> tokens.FileChunks:
        made.append(real_plan_chunks(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tokens, "plan_chunks", recorded)

    def run(tier: str, **kw: Any):
        return export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier=tier,
                                   storage=storage, file_tokens=file_tokens, shuffle_seed=seed, **kw)

    local = run("local")
    for workers in (1, 2):
        log = tmp_path / f"log{workers}"
        log.mkdir()
        monkeypatch.setattr(tokens, "TokenFileWriter", partial(MeasuredWriter, log=str(log)))
        remote = run(f"ray{workers}", engine=ray_engine, workers=workers, chunk_bytes=CHUNK)
        monkeypatch.setattr(tokens, "TokenFileWriter", TokenFileWriter)
        _same_bytes(local, remote, "local", f"ray{workers}")
        logged = _logged(log)
        assert sorted(logged) == list(range(len(local.files)))
        for file in logged.values():
            batches = file["batches"]
            assert all(b["bytes"] <= CHUNK or b["rows"] == 1 for b in batches), batches
            grown = batches[-1]["allocated"] - batches[0]["allocated"]
            assert grown <= 4 * CHUNK, batches  # a few chunks, not the file (~150 documents of ~100 B)
        chunks = made[-1]
        for index, file in logged.items():
            batches = file["batches"]
            assert len(batches) == len(chunks.of_file(index)) >= (20 if file_tokens == 10**6 else 2)
            assert [b["rows"] for b in batches] == [chunks.router.samples[c] for c in chunks.of_file(index)]
    order, docs = expected(lake, version, path, seed)
    ids, read = read_all(remote, "ray2")
    assert ids == order and read == [docs[i] for i in order]


@pytest.mark.parametrize(("file_tokens", "seed"), [(10**6, 5), (400, None)])
def test_spark_streams_a_file_in_sorted_batches_the_bytes_of_a_local_export(tmp_path, monkeypatch, spark_engine,
                                                                            file_tokens, seed) -> None:
    """Spark batches of 7 rows (``spark.sql.execution.arrow.maxRecordsPerBatch``): a file's sorted rows come to its
    task in batches of at most 7 documents, in export order across batches (the order hash's bits compared as
    unsigned, as the plan does), and the bytes are a local export's. Before, a task got its whole file (applyInArrow
    of the file's group)."""
    lake, version = make_lake(tmp_path / "lake", 150)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("local", tmp_path / "local"), ("spark", tmp_path / "spark"))

    def run(tier: str, **kw: Any):
        return export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier=tier,
                                   storage=storage, file_tokens=file_tokens, shuffle_seed=seed, **kw)

    local = run("local")
    log = tmp_path / "log"
    log.mkdir()
    conf = spark_engine.session.conf
    before = conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    monkeypatch.setattr(tokens, "TokenFileWriter", partial(MeasuredWriter, log=str(log)))
    try:
        remote = run("spark", engine=spark_engine, workers=2)
    finally:
        conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", before)
    monkeypatch.setattr(tokens, "TokenFileWriter", TokenFileWriter)
    _same_bytes(local, remote, "local", "spark")
    logged = _logged(log)
    assert sorted(logged) == list(range(len(local.files)))
    for file in logged.values():
        rows = [b["rows"] for b in file["batches"]]
        assert sum(rows) == file["documents"] and max(rows) <= 7
        assert len(rows) >= (file["documents"] + 6) // 7
    assert max(len(f["batches"]) for f in logged.values()) >= (20 if file_tokens == 10**6 else 2)
    order, docs = expected(lake, version, path, seed)
    ids, read = read_all(remote, "spark")
    assert ids == order and read == [docs[i] for i in order]


def test_an_order_hash_with_its_top_bit_set_sorts_after_one_without_on_spark(tmp_path, spark_engine) -> None:
    """``write_sorted`` orders int64 bits as uint64 (``unsigned``): hashes >= 2**63 (negative as Spark's longs) come
    after the smaller ones, and equal hashes by id; the groups reach the sink in batches in that order (the default
    write partitions: Spark's shuffle partitions)."""
    from datahub.engines.spark.export import write_sorted

    hashes = np.array([3, 2**63 + 5, 2**63 - 1, 2**64 - 1, 3, 0], dtype=np.uint64)
    ids = ["b", "c", "d", "e", "a", "f"]
    expected_order = [i for _, i in sorted(zip(hashes.tolist(), ids))]
    schema = pa.schema([("group", pa.int64()), ("h", pa.int64()), ("id", pa.string())])
    got = write_sorted(spark_engine, [0, 1], read=_Halves(hashes.view(np.int64).tolist(), ids), key="group",
                       order=("h", "id"), unsigned=("h",), sink=_Ordered(), routed_schema=schema)
    assert sorted(got) == [(0, expected_order), (1, expected_order)]


@dataclass(frozen=True)
class _Halves:
    """Task t reads half the rows of both groups (picklable)."""

    hashes: list[int]
    ids: list[str]

    def __call__(self, task: int) -> Any:
        take = slice(task * 3, task * 3 + 3)
        for group in (0, 1):
            yield pa.table({"group": pa.array([group] * 3, pa.int64()), "h": pa.array(self.hashes[take], pa.int64()),
                            "id": self.ids[take]})


class _Ordered(Sink[Any, Any]):
    """A sink that returns its group and the ids in the order its batches gave them."""

    def write(self, batches: Any) -> Any:
        group, seen = None, []
        for batch in batches:
            group = batch.column("group")[0].as_py()
            seen.extend(batch.column("id").to_pylist())
        return group, seen

    def commit(self, results: Any) -> Any:
        return results


@pytest.mark.parametrize("damage", ["out of order", "lose a document", "shorten a document"])
def test_an_engine_writer_given_batches_that_disagree_with_the_plan_publishes_no_part(tmp_path, damage) -> None:
    """``TokenFileWriter.write`` (an engine task) checks as ``.bin`` is written that the batches follow one another
    in export order and that the file gets the plan's documents and tokens; ``.bin`` is published first, so a
    failed check leaves no part of the file on the tier. Undamaged, the same batches publish the file."""
    from datahub.errors import IntegrityError
    from datahub.export.plan import ShardRouter
    from datahub.export.tokens import ROUTED, LoadedTokenizer, load_tokenizer

    loaded: LoadedTokenizer = load_tokenizer(train_tokenizer(tmp_path / "tok.json"))
    texts = pa.array([f"document {i} " + "word " * i for i in range(9)])
    flat, lengths = loaded.encode(texts)
    ids = pa.array([f"id-{i:02d}" for i in range(9)], pa.string())
    rows = pa.table([pa.array([0] * 9, pa.int64()), pa.array([0] * 9, pa.int64()), ids,
                     tokens.documents_array(flat, lengths)], schema=ROUTED)
    tier = cfs_storage(("cfs", tmp_path / "cfs")).tier("cfs")
    writer = TokenFileWriter(release="r", tokenizer=loaded, router=ShardRouter(np.asarray([b"id-00"]), None, (9,)),
                             shuffle_seed=None, starts=(0,), tokens=(int(lengths.sum()),), tier_name=tier.name,
                             tier_spec=tier.spec, tier_source=tier.source, folder="tokens-x")
    batches = [rows.slice(0, 4), rows.slice(4, 5)]
    if damage == "out of order":
        batches.reverse()
    elif damage == "lose a document":
        batches[1] = batches[1].slice(1)
    else:
        documents = batches[1].column("tokens").combine_chunks()
        shorter = pa.array([documents[0].as_py()[:-2], *documents.slice(1).to_pylist()], pa.large_binary())
        batches[1] = batches[1].set_column(3, "tokens", shorter)
    message = {"out of order": "out of export order", "lose a document": "the plan has",
               "shorten a document": "counted"}[damage]
    with pytest.raises(IntegrityError, match=message):
        writer.write(iter(batches))
    assert not [p for p in (tmp_path / "cfs").rglob("*") if p.is_file()]
    done = writer.write(iter([rows.slice(0, 4), rows.slice(4, 5)]))
    assert (done.documents, done.tokens) == (9, int(lengths.sum()))
    assert (tmp_path / "cfs" / "r" / "tokens-x" / "r-000000.bin").read_bytes() == flat.tobytes()


GROUPED = pa.schema([("group", pa.int64()), ("value", pa.int64())])


@dataclass(frozen=True)
class _Rows:
    """A read task: one row for each of groups 0, 1, 2 (Spark's ``write_sorted``)."""

    def __call__(self, task: int) -> Any:
        yield pa.table({"group": pa.array([0, 1, 2], pa.int64()), "value": pa.array([task] * 3, pa.int64())},
                       schema=GROUPED)


@dataclass(frozen=True)
class _RunRows:
    """A read task of ``spill_runs``: its run holds one row for each of groups 0, 1, 2, in that order."""

    def __call__(self, task: int) -> tuple[pa.Table, pa.Table]:
        return pa.table({"value": pa.array([task] * 3, pa.int64())}), pa.table({"rows": [3]})


@dataclass(frozen=True)
class _FailingGroups(Sink[int, list]):
    """Writes a group batch by batch (returns its key); in ``folder``, group 0 raises once another group's write
    runs."""

    folder: str | None = None

    def write(self, batches: Any) -> int:
        group = None
        for batch in batches:
            group = int(batch["group"][0].as_py())
            if self.folder is not None:
                from tests.engines.task_locks import fail_once_running

                fail_once_running(self.folder, group)  # Spark may hand one task two groups: it waits for the other's
        assert group is not None
        return group

    def commit(self, results: list) -> list:
        return sorted(results)


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_a_failed_streamed_group_write_leaves_no_task_running(tmp_path, request, engine_name) -> None:
    """Ray's ``write_pieces`` and Spark's ``write_sorted`` (the token export's write passes): a write task that
    fails while others run stops them before the error reaches the caller (the export then removes its runs)."""
    from tests.engines.task_locks import assert_stopped, still_running

    engine = request.getfixturevalue(f"{engine_name}_engine")

    def write(sink: _FailingGroups) -> list[int]:
        if engine_name == "spark":
            from datahub.engines.spark.export import write_sorted

            return sorted(write_sorted(engine, [0, 1, 2], read=_Rows(), key="group", order=("value",), sink=sink,
                                       routed_schema=GROUPED, workers=2))
        from datahub.engines.ray.export import remove_runs, spill_runs, write_pieces

        directory = str(tmp_path / "runs")
        runs = [run for run, _ in spill_runs(engine, [0, 1, 2], read=_RunRows(), directory=directory, workers=2)]
        try:
            groups = [(group, [[(run, group, group + 1) for run in range(len(runs))]]) for group in range(3)]
            return sorted(write_pieces(engine, runs, groups, key="group", sink=sink, workers=2))
        finally:
            remove_runs(engine, runs, directory)

    assert write(_FailingGroups()) == [0, 1, 2]
    writes = tmp_path / "writes"
    writes.mkdir()
    with pytest.raises(Exception, match="task 0 fails"):
        write(_FailingGroups(str(writes)))
    if engine_name == "spark":
        # Spark ends a cancelled task in the JVM first and kills its Python worker asynchronously (datahub's wait
        # sees the JVM side: engines/spark/jobs.py); on a loaded machine (the fresh-clone CI once) the worker
        # outlived the error by a moment. Bounded here by Spark's own kill path: monitor poll 2 s + killTimeout 2 s.
        deadline = time.monotonic() + 10
        while still_running(writes) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert_stopped(writes)


@dataclass(frozen=True)
class _Numbers:
    """A read task of ``spill_runs``: its run holds rows ``task * 100 + 0 .. 9`` in order."""

    def __call__(self, task: int) -> tuple[pa.Table, pa.Table]:
        return pa.table({"value": pa.array(np.arange(10) + 100 * task, pa.int64())}), pa.table({"rows": [10]})


@dataclass(frozen=True)
class _Batches(Sink[Any, list]):
    """Returns its group and the values of each batch it was handed, batch by batch."""

    def write(self, batches: Any) -> Any:
        seen = [(int(b["group"][0].as_py()), b["value"].to_pylist()) for b in batches]
        return seen[0][0], [values for _, values in seen]

    def commit(self, results: list) -> list:
        return sorted(results)


@pytest.mark.parametrize("local_reads", [True, False])
def test_write_pieces_hands_the_sink_one_batch_per_piece_of_every_run(tmp_path, ray_engine, local_reads) -> None:
    """A group's pieces reach the sink one batch each, in order, with the piece's rows of every run (slices read
    from the runs on this node, or fetched by a task on the run's node as between nodes); a piece without rows
    gives no batch."""
    from datahub.engines.ray.export import remove_runs, spill_runs, write_pieces

    directory = str(tmp_path / "runs")
    runs = [run for run, _ in spill_runs(ray_engine, [0, 1], read=_Numbers(), directory=directory, workers=2)]
    groups = [(7, [[(0, 0, 2), (1, 0, 1)], [], [(1, 1, 5)], [(0, 2, 10), (1, 5, 10)]]), (8, [[(1, 0, 3)]])]
    got = sorted(write_pieces(ray_engine, runs, groups, key="group", sink=_Batches(), workers=2,
                              local_reads=local_reads))
    remove_runs(ray_engine, runs, directory)
    assert got == [(7, [[0, 1, 100], [101, 102, 103, 104], [2, 3, 4, 5, 6, 7, 8, 9, 105, 106, 107, 108, 109]]),
                   (8, [[100, 101, 102]])]


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_an_engine_rewrites_only_the_damaged_file_a_chunk_at_a_time(tmp_path, request, engine_name) -> None:
    """Exporting again to a tier that holds the files rewrites the damaged one alone, on the engine: its read tasks
    route only that file's chunks (Ray) or documents (Spark), and it gets its bytes back."""
    engine = request.getfixturevalue(f"{engine_name}_engine")
    lake, version = make_lake(tmp_path / "lake", 120)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("cfs", tmp_path / "cfs"))

    def run(**kw: Any):
        return export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path,
                                   tier="cfs", storage=storage, file_tokens=400, shuffle_seed=2, **kw)

    manifest = run()
    assert len(manifest.files) > 3
    damaged = {suffix: Path(manifest.files[2].replicas["cfs"] + suffix) for suffix in (".bin", ".ids")}
    whole = {suffix: file.read_bytes() for suffix, file in damaged.items()}
    damaged[".bin"].write_bytes(whole[".bin"][:-2])
    damaged[".ids"].unlink()
    others = {f.prefix: Path(f.replicas["cfs"] + ".bin").stat().st_mtime_ns for f in manifest.files}
    assert run(engine=engine, workers=2, chunk_bytes=300) == manifest
    assert {suffix: file.read_bytes() for suffix, file in damaged.items()} == whole
    assert {prefix: Path(f.replicas["cfs"] + ".bin").stat().st_mtime_ns for prefix, f in
            zip(others, manifest.files) if prefix != manifest.files[2].prefix} == \
        {prefix: mtime for prefix, mtime in others.items() if prefix != manifest.files[2].prefix}


@dataclass(frozen=True)
class _CountedReads(Sink[Any, list]):
    """Counts, in its own write task's process while it takes the batches, the runs memory-mapped there
    (``pa.memory_map``) and the fetched objects waited for (refs handed to ``ray.get``); returns (group, opens,
    fetched, values of each batch)."""

    def write(self, batches: Any) -> Any:
        import ray

        counts = {"opens": 0, "fetched": 0}
        real_map, real_get = pa.memory_map, ray.get

        def counted_map(*args: Any, **kwargs: Any) -> Any:
            counts["opens"] += 1
            return real_map(*args, **kwargs)

        def counted_get(refs: Any, *args: Any, **kwargs: Any) -> Any:
            counts["fetched"] += len(refs) if isinstance(refs, list) else 1
            return real_get(refs, *args, **kwargs)

        pa.memory_map, ray.get = counted_map, counted_get
        try:
            seen = [(int(b["group"][0].as_py()), b["value"].to_pylist()) for b in batches]
        finally:
            pa.memory_map, ray.get = real_map, real_get
        return seen[0][0], counts["opens"], counts["fetched"], [values for _, values in seen]

    def commit(self, results: list) -> list:
        return sorted(results)


@pytest.mark.parametrize("local_reads", [True, False])
def test_write_pieces_opens_each_run_once_per_task_and_fetches_a_piece_once_per_node(tmp_path, ray_engine,
                                                                                   local_reads) -> None:
    """A write task of ``write_pieces`` memory-maps each run on its node once for its whole group, not once per
    piece, and gets a piece's rows of another node's runs with one fetch for the node, not one per run. Before,
    with 3 runs and 5 pieces, the task opened every run for every piece (15 opens), or waited for 15 fetches."""
    from datahub.engines.ray.export import remove_runs, spill_runs, write_pieces

    directory = str(tmp_path / "runs")
    runs = [run for run, _ in spill_runs(ray_engine, [0, 1, 2], read=_Numbers(), directory=directory, workers=2)]
    pieces = [[(run, 2 * piece, 2 * piece + 2) for run in range(3)] for piece in range(5)]
    try:
        got = list(write_pieces(ray_engine, runs, [(7, pieces)], key="group", sink=_CountedReads(), workers=1,
                                local_reads=local_reads))
    finally:
        remove_runs(ray_engine, runs, directory)
    [(group, opens, fetched, values)] = got
    assert (group, values) == (7, [[2 * p, 2 * p + 1, 100 + 2 * p, 101 + 2 * p, 200 + 2 * p, 201 + 2 * p]
                                   for p in range(5)])
    assert (opens, fetched) == ((3, 0) if local_reads else (0, 5))


def test_a_write_task_maps_its_runs_again_after_remap_bytes(tmp_path, ray_engine, monkeypatch) -> None:
    """A mapping keeps every page it has read resident until it is unmapped, so a write task that mapped each run
    once for a whole file would come to hold the file (a reviewer measured RSS 155 -> 237 MB over a 96 MB run read
    in 12 pieces): after ``remap_bytes`` sliced it drops its mappings and maps the runs again. Run in this process
    (the runs are on this node), counting ``pa.memory_map`` calls."""
    from datahub.engines.ray import export as ray_export

    directory = str(tmp_path / "runs")
    runs = [run for run, _ in ray_export.spill_runs(ray_engine, [0, 1, 2], read=_Numbers(), directory=directory,
                                                    workers=2)]
    pieces = [[(run, 2 * piece, 2 * piece + 2) for run in range(3)] for piece in range(5)]
    opens = []
    real = pa.memory_map
    monkeypatch.setattr(ray_export.pa, "memory_map", lambda *a, **k: opens.append(a[0]) or real(*a, **k))
    try:
        def gathered(remap_bytes: int) -> list[list[int]]:
            opens.clear()
            return [t["value"].to_pylist() for t in
                    ray_export._gathered_pieces("group", 7, runs, pieces, True, remap_bytes=remap_bytes)]

        whole = gathered(ray_export.REMAP_BYTES)
        assert len(opens) == 3, "each run mapped once while less than REMAP_BYTES was sliced"
        piecewise = gathered(1)  # every piece slices more than 1 byte: the runs are mapped again for each piece
        assert len(opens) == 3 * 5
        assert piecewise == whole == [[2 * p, 2 * p + 1, 100 + 2 * p, 101 + 2 * p, 200 + 2 * p, 201 + 2 * p]
                                      for p in range(5)]
    finally:
        ray_export.remove_runs(ray_engine, runs, directory)

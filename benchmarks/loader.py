"""Loader throughput and remote bytes: ReleaseDataset with its defaults vs webdataset, workers, and a Ceph tier.

    .venv/bin/python benchmarks/loader.py [--shards 40 --samples 2500 --text-bytes 2500] [--writer export|fixture]
                                          [--rounds 3] [--no-ceph]

The shards are written by the real export path (``datahub.export.export_table_version`` from a Delta
``samples`` table in a temporary lake to a cfs tier), or with ``--writer fixture`` by the loader tests'
shard writer (no Delta, faster to set up).

What is measured is what the README recommends: ``ReleaseDataset`` with its defaults (block shuffle, sha256
verification, prefetch), ``batch_size=256, batch_format="arrow"`` (RecordBatches of sample_id/text/is_padding),
iterated directly (0 workers) or through ``DataLoader(dataset, batch_size=None, num_workers=N)``. webdataset
runs with its defaults (undecoded bytes per sample, its fastest mode; ``.batched(256)`` through the same
DataLoader with workers). Each timed run builds a fresh dataset; what carries over between repeats is the page
cache and ReleaseDataset's sha256 verdict store (by default ``~/.cache/datahub/verified``, here a directory in the
benchmark's temporary root): after the untimed warm-up read hashed every shard once, the timed runs read verified
shards, as a trainer's later epochs and restarted jobs do. The first read of a release (every shard hashed, on the
prefetch threads) is timed too, with a fresh store per run, labelled "shards not yet verified".

Last lines:
  speedup_vs_webdataset_defaults_0_workers / _2_workers   samples/s ratio (goal >= 10)
  speedup_vs_webdataset_first_read_0_workers / _2_workers  the same for a release's first read (fresh verdict
                                                           store: every shard hashed once, on the prefetch threads)
  workers_scaling                                          ReleaseDataset 4 workers / 1 worker (goal >= 1.5)
  workers_scaling_persistent_workers                       the same with ``persistent_workers=True`` (one DataLoader
                                                           per worker count, made and run once before the rounds;
                                                           each timed epoch is ``set_epoch(e)`` and one pass: no
                                                           fork per epoch, as a trainer with persistent workers runs)
  workers_scaling_cpu_ceiling_2_cores                      informational: 1-worker time / (4-worker CPU of
                                                           trainer + workers / 2): what the scaling would be if the
                                                           4 workers kept both cores busy (before it, the CPU
                                                           seconds of both runs, per extra worker, and what
                                                           torch's DataLoader alone costs per extra worker with a
                                                           trivial dataset; likewise for tokens)
  workers_scaling_no_per_worker_cost                       informational, not the goal: the same DataLoader with
                                                           1 and 4 fresh workers over ``BusyItems``, a dataset with
                                                           no per-worker cost of its own (one busy loop per batch,
                                                           a few bytes sent) whose 1-worker epoch costs the same CPU
                                                           as ReleaseDataset's, in the same rounds: what any dataset
                                                           could reach in this process at this load (with the
                                                           trainer's anonymous memory, whose page tables each fork
                                                           copies); likewise for tokens
  remote_bytes_per_epoch_ratio                             bytes the 4 workers fetched from Ceph / release
                                                           bytes (goal <= 1.05; also the RGW's own get_b
                                                           counter when its admin socket is reachable)
A stripped-down mode (no shuffle, no sha256, no prefetch, per-sample dicts) is printed too, labelled as such.

Tokens (``--tokens N``, default 16M; ``--no-text`` runs only this part): a token release of N uint16 tokens in
8 Megatron ``.bin``/``.idx`` files (``datahub.shards.indexed``; documents of ~600 tokens, lognormal, each ended
by EOD), read as packed sequences of ``--seq-len`` (2048) tokens in batches of 8 by ``PackedDataset`` with its
defaults (document block shuffle, position and segment ids), and the same token stream packed at write time into
MosaicML Streaming's MDS format (one ``bytes`` column of seq_len tokens per sample, no compression, as
llm-foundry's ``--concat_tokens`` writes it) read by ``StreamingDataset(shuffle=True, batch_size=8)``, both
through ``DataLoader`` with 0 and 2 workers (interleaved rounds, medians):
  tokens_vs_streaming                                      packed tokens/s ratio, 2 workers (goal >= 2)
  tokens_vs_streaming_0_workers                            the same with 0 workers
  workers_scaling_tokens                                   PackedDataset 4 workers / 1 worker (goal >= 1.5)
  workers_scaling_tokens_persistent_workers                the same with ``persistent_workers=True`` (as for text)
  peak_memory_tokens_mb                                    whole process tree (PSS), one epoch with 2 workers,
                                                           at N and 4N tokens
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datahub.loader.shard_source import ShardBytes, ShardSource  # noqa: E402
from tests.loader.shards import write_release  # noqa: E402

BATCH = 256
RECOMMENDED: dict[str, Any] = {"batch_size": BATCH, "batch_format": "arrow"}  # the README's usage; defaults otherwise
STRIPPED: dict[str, Any] = {"shuffle": False, "verify": False, "prefetch_shards": 0}  # labelled: not the defaults


def exported_release(root: Path, *, shards: int, samples: int, text_bytes: int) -> str:
    """A release written by ``datahub export`` to a cfs tier under ``root``; returns its manifest path."""
    import hashlib

    import pyarrow as pa

    from datahub.export import export_table_version
    from datahub.lake import Lake
    from datahub.storage import validate_storage_config

    count = shards * samples
    ids = [hashlib.sha256(f"doc {i}".encode()).hexdigest()[:32] for i in range(count)]
    texts = [(f"document {i} " * (text_bytes // 10 + 1))[:text_bytes] for i in range(count)]
    table = pa.table({"sample_id": ids, "text": texts, "source_uri": [f"file:///in/{i % 7}.jsonl" for i in range(count)],
                      "meta": [json.dumps({"n": i}) for i in range(count)]})
    lake = Lake(root / "lake")
    version = lake.commit("samples", table, txn="bench/1")
    storage = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": str(root / "cfs")}}}, source="bench")
    export_table_version(lake, table="samples", version=int(version or 0), release_name="bench-v1", tier="cfs",
                         storage=storage, shard_samples=samples)
    return str(root / "cfs" / "bench-v1" / "manifest.json")


def cpu_seconds() -> float:
    """CPU (user + system) of this process and of its children that have exited (DataLoader joins its workers)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def torch_worker_cpu(rounds: int) -> float:
    """CPU seconds (trainer + workers) per extra fresh DataLoader worker that torch itself costs: a trivial
    IterableDataset (4 items) through 1 and 4 workers, median of ``rounds``; the floor under any dataset's."""
    from torch.utils.data import DataLoader, IterableDataset

    class Trivial(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(range(4))

    def cpu_of(workers: int) -> float:
        start = cpu_seconds()
        sum(1 for _ in DataLoader(Trivial(), batch_size=None, num_workers=workers))
        return cpu_seconds() - start

    cpu_of(1), cpu_of(4)  # warm-up
    return statistics.median((cpu_of(4) - cpu_of(1)) / 3 for _ in range(max(3, rounds)))


class BusyItems:
    """A dataset with no per-worker cost of its own: ``items`` items dealt round-robin to the DataLoader's workers,
    each costing ``seconds`` of the reading worker's CPU (a busy loop) and a few bytes to send. Through the same
    DataLoader, it shows what fresh workers can reach in this process at this load when the dataset itself adds
    nothing per worker (informational: the ceiling of ``workers_scaling``)."""

    def __init__(self, items: int, seconds: float) -> None:
        self.items, self.seconds = items, seconds

    def __iter__(self) -> Any:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        for item in range(worker, self.items, workers):
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
            yield item


def busy_iter(items: int, seconds: float, workers: int) -> int:
    from torch.utils.data import DataLoader, IterableDataset

    class Busy(BusyItems, IterableDataset):  # type: ignore[misc,type-arg]
        pass

    count = sum(1 for _ in DataLoader(Busy(items, seconds), batch_size=None, num_workers=workers))
    assert count == items, count
    return count


def busy_like(run: Any, items: int) -> float:
    """Seconds per item for ``BusyItems`` whose 1-worker epoch costs the CPU (trainer + worker) that ``run`` (a
    1-worker epoch of the dataset measured) costs: the median of 3 runs each, two linear corrections."""
    def cpu_of(job: Any) -> float:
        costs = []
        for _ in range(3):
            start = cpu_seconds()
            job()
            costs.append(cpu_seconds() - start)
        return statistics.median(costs)

    target = cpu_of(run)
    seconds = 0.5 * target / items
    for _ in range(2):  # the DataLoader's own cost per item is the intercept: two linear corrections
        measured = cpu_of(lambda: busy_iter(items, seconds, 1))
        seconds = max(1e-6, seconds + (target - measured) / items)
    return seconds


def anon_mb() -> float:
    """This process's anonymous resident memory (MB): a fork copies its page tables, and the pages this process or
    the child then writes are copied, so each fresh DataLoader worker costs more as it grows."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


BUSY_ONE, BUSY_FOUR = "BusyItems, no per-worker cost (1 worker)", "BusyItems, no per-worker cost (4 workers)"


def print_busy(label: str, seconds: float, items: int, cpu_one: float, cpu_four: float, scaling: float) -> None:
    """The informational ceiling: ``BusyItems`` as costly as the measured dataset with 1 worker, through 1 and 4
    fresh workers in the same rounds, and the trainer's anonymous memory that every fork copies."""
    print(f"{label}_no_per_worker_cost (informational, not the goal: BusyItems, {items} items of {seconds * 1e3:.3f} ms "
          f"busy CPU each, a few bytes sent, the same 1-worker CPU per epoch as the dataset; cpu per epoch 1 worker "
          f"{cpu_one:.3f} s, 4 workers {cpu_four:.3f} s; trainer process anonymous memory {anon_mb():.0f} MB, which "
          f"each fork copies the page tables of: what 4 fresh workers reach here when the dataset adds nothing "
          f"per worker): {scaling:.2f}")


def print_cpu(label: str, one: str, four: str, seconds: dict[str, float], cpu: dict[str, float],
              torch_per_worker: float) -> None:
    """CPU per epoch of the 1- and 4-worker runs, per extra worker (and torch's own share of that), and what 4
    workers could reach if they kept both cores busy."""
    print(f"cpu per epoch, trainer + workers ({label}): 1 worker {cpu[one]:.3f} s in {seconds[one]:.3f} s, "
          f"4 workers {cpu[four]:.3f} s in {seconds[four]:.3f} s; per extra worker "
          f"{(cpu[four] - cpu[one]) / 3 * 1e3:.1f} ms, of which torch's DataLoader alone (trivial dataset, fork to "
          f"exit) {torch_per_worker * 1e3:.1f} ms")
    print(f"{label}_cpu_ceiling_2_cores (informational: 1-worker time / (4-worker CPU / 2), the scaling if 4 "
          f"workers kept both cores busy): {seconds[one] / (cpu[four] / 2):.2f}")


def raw_read(paths: list[str]) -> int:
    for path in paths:
        with open(path, "rb") as handle:
            handle.read()
    return 0


def webdataset_iter(urls: list[str], workers: int) -> int:
    import webdataset
    from torch.utils.data import DataLoader

    dataset = webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)
    if workers == 0:
        return sum(1 for _ in dataset)
    batched = dataset.batched(BATCH, collation_fn=None)
    return sum(len(batch) for batch in DataLoader(batched, batch_size=None, num_workers=workers))


def rows(item: Any) -> int:
    return item.num_rows if hasattr(item, "num_rows") else len(item) if isinstance(item, list) else 1


VERDICTS: dict[str, str] = {}  # the verdict store of the timed runs (the defaults' one lives in ~/.cache)


def release_iter(manifest: str | dict[str, Any], workers: int, *, source: Any = None, **settings: Any) -> int:
    from torch.utils.data import DataLoader

    from datahub.loader import ReleaseDataset

    settings.setdefault("verdicts_dir", VERDICTS.get("dir"))
    dataset = ReleaseDataset(manifest, rank=0, world_size=1, **settings)
    if source is not None:
        dataset.source = source(dataset)
    if workers == 0:
        return sum(rows(item) for item in dataset)
    return sum(rows(item) for item in DataLoader(dataset, batch_size=None, num_workers=workers))


class PersistentEpochs:
    """One ``DataLoader(persistent_workers=True)`` over a ReleaseDataset; each call reads the next epoch
    (``set_epoch``) with the same worker processes."""

    def __init__(self, manifest: str, workers: int, **settings: Any) -> None:
        from torch.utils.data import DataLoader

        from datahub.loader import ReleaseDataset

        settings.setdefault("verdicts_dir", VERDICTS.get("dir"))
        self.dataset = ReleaseDataset(manifest, rank=0, world_size=1, **settings)
        self.loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, persistent_workers=True)
        self.epoch = -1

    def __call__(self) -> int:
        self.epoch += 1
        self.dataset.set_epoch(self.epoch)
        return sum(rows(item) for item in self.loader)


class CountingSource(ShardSource):
    """Appends the size of every remote fetch to a file, so the bytes DataLoader workers download are observable."""

    log_path: str

    def _fetch(self, tier: str, uri: str, *, mapped: bool) -> tuple[ShardBytes, tuple[int, ...] | None]:
        data, identity = super()._fetch(tier, uri, mapped=mapped)
        if identity is None:  # a remote object, not a local file
            with open(self.log_path, "a") as log:
                log.write(f"{os.getpid()} {len(data)}\n")
        return data, identity


def rgw_get_bytes() -> int | None:
    """radosgw's get_b perf counter (all clients), or None when its admin socket cannot be reached."""
    state = os.environ.get("DATAHUB_CEPH_DIR") or "/tmp/datahub-ceph"
    try:
        out = subprocess.run(["ceph", "--conf", f"{state}/ceph.conf", "daemon", "client.rgw.a", "perf", "dump"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return int(json.loads(out)["rgw"]["get_b"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


def ceph_bytes_ratio(manifest: dict[str, Any], workers: int) -> None:
    """Upload the release to the CI's Ceph, read one epoch with ``workers`` DataLoader workers, print the ratio."""
    from tests.ceph import ceph_s3_config

    endpoint = ceph_s3_config()
    if endpoint is None:
        print("remote_bytes_per_epoch_ratio: skipped (no Ceph S3 endpoint; see tests/ceph.py)")
        return
    bucket = endpoint.new_bucket("bench-loader")
    fs = endpoint.filesystem()
    remote = json.loads(json.dumps(manifest))
    try:
        for shard in remote["shards"]:
            uri = f"s3://{bucket}/bench-v1/{shard['name']}"
            fs.pipe_file(uri[len("s3://"):], Path(shard["replicas"]["cfs"]).read_bytes())
            shard["replicas"] = {"ceph": uri}
        release_bytes = sum(shard["size"] for shard in remote["shards"])
        del fs  # s3fs references itself: freed here, not by the collector in a forked worker (its session's
        gc.collect()  # finalizer then prints "attached to a different loop" there; see datahub/loader/manifest.py)
        with tempfile.TemporaryDirectory() as scratch:
            log_path = os.path.join(scratch, "fetches.log")

            def counting(dataset: Any) -> CountingSource:
                source = CountingSource(dataset.manifest, storage={"ceph": endpoint.s3fs_kwargs()},
                                        tier_preference=["ceph"])
                source.log_path = log_path
                return source

            before = rgw_get_bytes()
            start = time.perf_counter()
            count = release_iter(remote, workers, source=counting, storage={"ceph": endpoint.s3fs_kwargs()},
                                 tier_preference=["ceph"], **RECOMMENDED)
            seconds = time.perf_counter() - start
            after = rgw_get_bytes()
            fetched = [line.split() for line in Path(log_path).read_text().splitlines()]
        assert count == manifest["num_samples"], count
        fetched_bytes = sum(int(size) for _, size in fetched)
        print(f"ceph, {workers} workers: {count} samples in {seconds:.2f} s ({release_bytes / seconds / 1e6:.1f} MB/s), "
              f"{len(fetched)} fetches by {len({pid for pid, _ in fetched})} processes, "
              f"{fetched_bytes / 1e6:.1f} MB fetched of a {release_bytes / 1e6:.1f} MB release")
        if before is not None and after is not None:
            print(f"rgw_get_bytes_ratio (radosgw get_b over the run, includes any other client): "
                  f"{(after - before) / release_bytes:.3f}")
        print(f"remote_bytes_per_epoch_ratio: {fetched_bytes / release_bytes:.3f}")
    finally:
        endpoint.filesystem().rm(bucket, recursive=True)


SEQ_LEN, TOKEN_BATCH = 2048, 8


def token_release(root: Path, tokens: int, *, seq_len: int, files: int = 8, mds: bool = True) -> list[str]:
    """Write ``tokens`` uint16 tokens as ``files`` indexed files (and, with ``mds``, the same stream packed into
    MDS samples of ``seq_len`` tokens under ``root/mds``); returns the indexed prefixes."""
    import numpy as np

    from datahub.shards.indexed import IndexedWriter

    rng = np.random.default_rng(0)
    eod = 0
    prefixes, stream = [], []
    for f in range(files):
        want = tokens // files
        lengths = np.maximum(1, rng.lognormal(6.0, 0.8, size=want // 300 + 16).astype(np.int64))
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), want)) + 1]
        flat = rng.integers(1, 50000, size=int(lengths.sum()), dtype=np.uint16)
        flat[np.cumsum(lengths) - 1] = eod  # every document ends with EOD, as datahub's export writes them
        prefix = str(root / f"tok-{f:06d}")
        with IndexedWriter(prefix, dtype=np.uint16) as writer:
            writer.add_documents(flat, lengths, [f"d{f}-{i}" for i in range(len(lengths))])
        prefixes.append(prefix)
        if mds:
            stream.append(flat)
    if mds:
        from streaming import MDSWriter

        packed = np.concatenate(stream)
        packed = np.concatenate([packed, np.zeros(-len(packed) % seq_len, dtype=np.uint16)])  # last one padded
        with MDSWriter(out=str(root / "mds"), columns={"tokens": "bytes"}, compression=None,
                       size_limit=1 << 26) as writer:
            for start in range(0, len(packed), seq_len):
                writer.write({"tokens": packed[start:start + seq_len].tobytes()})
    return prefixes


def import_streaming() -> None:
    """mosaicml-streaming's package imports torchvision (for its vision datasets) and transformers (BatchFeature);
    when they are not installed (no torchvision build matches this torch here; transformers pins an older
    huggingface-hub than datatrove's), stub packages stand in: MDS reading never touches them. Install it with
    ``pip install --no-deps mosaicml-streaming python-snappy zstd brotli`` (its dependencies would replace the
    pinned torch, numpy and botocore)."""
    try:
        import transformers  # noqa: F401
    except ImportError:  # streaming's dataloader imports BatchFeature only to pass it through; MDS reading never does
        tstub = Path(tempfile.mkdtemp(prefix="transformers-stub-")) / "transformers"
        tstub.mkdir()
        (tstub / "__init__.py").write_text("")
        (tstub / "feature_extraction_utils.py").write_text("class BatchFeature(dict):\n    pass\n")
        (tstub / "tokenization_utils_base.py").write_text("class BatchEncoding(dict):\n    pass\n")
        (tstub / "models" / "auto").mkdir(parents=True)
        (tstub / "models" / "__init__.py").write_text("")
        (tstub / "models" / "auto" / "__init__.py").write_text("")
        (tstub / "models" / "auto" / "tokenization_auto.py").write_text("class AutoTokenizer:\n    pass\n")
        sys.path.append(str(tstub.parent))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        stub = Path(tempfile.mkdtemp(prefix="torchvision-stub-")) / "torchvision"
        (stub / "transforms").mkdir(parents=True)
        (stub / "__init__.py").write_text("")
        (stub / "datasets.py").write_text("class VisionDataset:\n    pass\n\n\nclass CIFAR10(VisionDataset):\n    pass\n")
        (stub / "transforms" / "__init__.py").write_text("")
        (stub / "transforms" / "functional.py").write_text("def to_tensor(x):\n    raise NotImplementedError\n")
        sys.path.append(str(stub.parent))
    try:
        import streaming  # noqa: F401
    except ImportError as error:
        sys.exit(f"benchmarks/loader.py: the token part compares with MosaicML Streaming, which does not import here "
                 f"({error}). Install it and the compression modules it imports: `.venv/bin/python -m pip install "
                 f"--no-deps mosaicml-streaming python-snappy zstd brotli`, or run with --tokens 0 to skip tokens.")


def packed_iter(prefixes: list[str], workers: int) -> int:
    from torch.utils.data import DataLoader

    from datahub.loader import PackedDataset

    dataset = PackedDataset(prefixes, seq_len=SEQ_LEN, batch_size=TOKEN_BATCH, rank=0, world_size=1)
    loader = dataset if workers == 0 else DataLoader(dataset, batch_size=None, num_workers=workers)
    # what a trainer touches: every array as a tensor (made by the worker that read the batch, or in-process)
    return sum(int(batch.to_torch()["loss_mask"].sum()) for batch in loader)


class PersistentPackedEpochs:
    """``packed_iter`` through one ``DataLoader(persistent_workers=True)``: each call reads the next epoch."""

    def __init__(self, prefixes: list[str], workers: int) -> None:
        from torch.utils.data import DataLoader

        from datahub.loader import PackedDataset

        self.dataset = PackedDataset(prefixes, seq_len=SEQ_LEN, batch_size=TOKEN_BATCH, rank=0, world_size=1)
        self.loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, persistent_workers=True)
        self.epoch = -1

    def __call__(self) -> int:
        self.epoch += 1
        self.dataset.set_epoch(self.epoch)
        return sum(int(batch.to_torch()["loss_mask"].sum()) for batch in self.loader)


def _stack_tokens(samples: list[dict[str, Any]]) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.stack([np.frombuffer(s["tokens"], dtype=np.uint16) for s in samples]).astype(np.int32))


def streaming_iter(mds_dir: str, workers: int) -> int:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    dataset = StreamingDataset(local=mds_dir, batch_size=TOKEN_BATCH, shuffle=True, shuffle_seed=0)
    loader = DataLoader(dataset, batch_size=TOKEN_BATCH, num_workers=workers, collate_fn=_stack_tokens)
    count = 0
    for batch in loader:
        count += batch.numel()
    del loader, dataset
    return count


def read_tokens_once(root: str, workers: int) -> None:
    """Child mode for the memory figure: one epoch of packed reads."""
    prefixes = sorted(str(p)[:-4] for p in Path(root).glob("tok-*.bin"))
    print(packed_iter(prefixes, workers))


def token_benchmark(tokens: int, rounds: int) -> None:
    import_streaming()
    from benchmarks._procmem import run_measured

    with tempfile.TemporaryDirectory() as root:
        prefixes = token_release(Path(root), tokens, seq_len=SEQ_LEN)
        mds_dir = str(Path(root) / "mds")
        total = sum(Path(p + ".bin").stat().st_size for p in prefixes) // 2
        sequences = -(-total // SEQ_LEN)
        runs = {
            "PackedDataset defaults (0 workers)": lambda: packed_iter(prefixes, 0),
            "MosaicML Streaming MDS (0 workers)": lambda: streaming_iter(mds_dir, 0),
            "PackedDataset defaults (1 worker)": lambda: packed_iter(prefixes, 1),
            "PackedDataset defaults (2 workers)": lambda: packed_iter(prefixes, 2),
            "MosaicML Streaming MDS (2 workers)": lambda: streaming_iter(mds_dir, 2),
            "PackedDataset defaults (4 workers)": lambda: packed_iter(prefixes, 4),
            "PackedDataset defaults, persistent workers (1 worker)": lambda: persistent[1](),
            "PackedDataset defaults, persistent workers (4 workers)": lambda: persistent[4](),
            BUSY_ONE: lambda: busy_iter(batches, busy_seconds, 1) * TOKEN_BATCH * SEQ_LEN,
            BUSY_FOUR: lambda: busy_iter(batches, busy_seconds, 4) * TOKEN_BATCH * SEQ_LEN,
        }
        persistent = {workers: PersistentPackedEpochs(prefixes, workers) for workers in (1, 4)}
        batches = -(-sequences // TOKEN_BATCH)
        busy_seconds = busy_like(runs["PackedDataset defaults (1 worker)"], batches)
        for name, run in runs.items():  # warm-up: imports, page cache, MDS index files, persistent workers' start
            if "0 workers" in name or "persistent" in name:
                run()
        timed: list[dict[str, float]] = []
        cpus: list[dict[str, float]] = []
        load_before = os.getloadavg()[0]
        for _ in range(rounds):
            times, cpu = {}, {}
            for name, run in runs.items():
                start, start_cpu = time.perf_counter(), cpu_seconds()
                count = run()
                times[name] = time.perf_counter() - start
                cpu[name] = cpu_seconds() - start_cpu
                assert count >= total - SEQ_LEN, (name, count, total)
            timed.append(times)
            cpus.append(cpu)
        persistent.clear()  # their workers exit when the loaders' iterators are collected
        print(f"tokens: {total} uint16 tokens in {len(prefixes)} indexed files, {sequences} sequences of {SEQ_LEN}, "
              f"batches of {TOKEN_BATCH}; medians of {rounds} interleaved rounds; load average "
              f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        for name in runs:
            if name in (BUSY_ONE, BUSY_FOUR):
                continue
            seconds = statistics.median(r[name] for r in timed)
            print(f"{name:<60} {total / seconds / 1e6:9.1f} M tokens/s {sequences / seconds:10.0f} sequences/s")

        def ratio(slow: str, fast: str) -> float:
            return statistics.median(r[slow] / r[fast] for r in timed)

        peaks = []
        for size in (tokens, 4 * tokens):
            with tempfile.TemporaryDirectory() as scratch:
                token_release(Path(scratch), size, seq_len=SEQ_LEN, mds=False)
                measured = run_measured([sys.executable, __file__, "--read-tokens", scratch, "--workers", "2"],
                                        cwd=str(Path(__file__).resolve().parents[1]))
                assert measured.returncode == 0, measured.stderr[-2000:]
                peaks.append(measured.peak_mb)
        print(f"peak_memory_tokens_mb: {peaks[0]:.0f} at {tokens} tokens, {peaks[1]:.0f} at {4 * tokens} tokens "
              f"(growth {peaks[1] / peaks[0]:.2f}x for 4x the tokens)")
        print(f"tokens_vs_streaming_0_workers: "
              f"{ratio('MosaicML Streaming MDS (0 workers)', 'PackedDataset defaults (0 workers)'):.2f}")
        print_cpu("workers_scaling_tokens", "PackedDataset defaults (1 worker)", "PackedDataset defaults (4 workers)",
                  {name: statistics.median(r[name] for r in timed) for name in runs},
                  {name: statistics.median(c[name] for c in cpus) for name in runs}, torch_worker_cpu(rounds))
        print_busy("workers_scaling_tokens", busy_seconds, batches, statistics.median(c[BUSY_ONE] for c in cpus),
                   statistics.median(c[BUSY_FOUR] for c in cpus), ratio(BUSY_ONE, BUSY_FOUR))
        print(f"workers_scaling_tokens: "
              f"{ratio('PackedDataset defaults (1 worker)', 'PackedDataset defaults (4 workers)'):.2f}")
        print(f"workers_scaling_tokens_persistent_workers (persistent_workers=True, set_epoch per epoch; not the goal's "
              f"fresh workers): "
              f"{ratio('PackedDataset defaults, persistent workers (1 worker)', 'PackedDataset defaults, persistent workers (4 workers)'):.2f}")
        print(f"tokens_vs_streaming: "
              f"{ratio('MosaicML Streaming MDS (2 workers)', 'PackedDataset defaults (2 workers)'):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--samples", type=int, default=2500, help="samples per shard")
    parser.add_argument("--text-bytes", type=int, default=2500, help="text size per sample")
    parser.add_argument("--writer", choices=["export", "fixture"], default="export", help="what writes the shards")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the timed runs")
    parser.add_argument("--no-ceph", action="store_true", help="skip the remote-bytes run on Ceph")
    parser.add_argument("--tokens", type=int, default=16_000_000, help="tokens of the token release (0: skip)")
    parser.add_argument("--no-text", action="store_true", help="run only the token part")
    parser.add_argument("--read-tokens", help=argparse.SUPPRESS)  # child mode of the memory figure
    parser.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_tokens:
        read_tokens_once(args.read_tokens, args.workers)
        return
    if args.tokens:
        token_benchmark(args.tokens, args.rounds)
    if args.no_text:
        return
    with tempfile.TemporaryDirectory() as root:
        if args.writer == "export":
            manifest_path = exported_release(Path(root), shards=args.shards, samples=args.samples,
                                             text_bytes=args.text_bytes)
            manifest = json.loads(Path(manifest_path).read_text())
        else:
            manifest = write_release(Path(root), samples_per_shard=[args.samples] * args.shards,
                                     text_bytes=args.text_bytes)
            manifest_path = str(Path(root) / "manifest.json")
        VERDICTS["dir"] = os.path.join(root, "verdicts")

        def unverified(workers: int) -> int:  # a fresh verdict store: the release's first read hashes every shard
            return check(release_iter(manifest_path, workers, verdicts_dir=tempfile.mkdtemp(dir=root), **RECOMMENDED))

        paths = [shard["replicas"]["cfs"] for shard in manifest["shards"]]
        total_mb = sum(shard["size"] for shard in manifest["shards"]) / 1e6
        total_samples = manifest["num_samples"]
        raw_read(paths)  # into page cache

        def check(count: int) -> int:
            assert count == total_samples, count
            return count

        runs = {  # interleaved: each round times every reader once, so drifts in machine speed hit all alike
            "raw_read": lambda: raw_read(paths),
            "webdataset defaults (0 workers)": lambda: check(webdataset_iter(paths, 0)),
            "ReleaseDataset defaults (0 workers)": lambda: check(release_iter(manifest_path, 0, **RECOMMENDED)),
            "ReleaseDataset stripped-down, per-sample dicts (0 workers)":
                lambda: check(release_iter(manifest_path, 0, **STRIPPED)),
            "webdataset defaults (2 workers)": lambda: check(webdataset_iter(paths, 2)),
            "ReleaseDataset defaults (1 worker)": lambda: check(release_iter(manifest_path, 1, **RECOMMENDED)),
            "ReleaseDataset defaults (2 workers)": lambda: check(release_iter(manifest_path, 2, **RECOMMENDED)),
            "ReleaseDataset defaults (4 workers)": lambda: check(release_iter(manifest_path, 4, **RECOMMENDED)),
            "ReleaseDataset defaults, list batches (1 worker)":
                lambda: check(release_iter(manifest_path, 1, batch_size=BATCH)),
            "ReleaseDataset defaults, list batches (4 workers)":
                lambda: check(release_iter(manifest_path, 4, batch_size=BATCH)),
            "ReleaseDataset defaults, shards not yet verified (0 workers)": lambda: unverified(0),
            "ReleaseDataset defaults, shards not yet verified (2 workers)": lambda: unverified(2),
            "ReleaseDataset defaults, persistent workers (1 worker)": lambda: check(persistent[1]()),
            "ReleaseDataset defaults, persistent workers (4 workers)": lambda: check(persistent[4]()),
            BUSY_ONE: lambda: busy_iter(batches, busy_seconds, 1),
            BUSY_FOUR: lambda: busy_iter(batches, busy_seconds, 4),
        }
        persistent = {workers: PersistentEpochs(manifest_path, workers, **RECOMMENDED) for workers in (1, 4)}
        batches = -(-total_samples // BATCH)
        busy_seconds = busy_like(runs["ReleaseDataset defaults (1 worker)"], batches)
        for name, run in runs.items():  # warm-up, untimed: imports and first-use costs of each reader, and the
            if "0 workers" in name or "persistent" in name:  # persistent workers' start (their first epoch)
                run()
        rounds: list[dict[str, float]] = []
        cpus: list[dict[str, float]] = []
        load_before = os.getloadavg()[0]
        for _ in range(args.rounds):
            times, cpu = {}, {}
            for name, run in runs.items():
                start, start_cpu = time.perf_counter(), cpu_seconds()
                run()
                times[name] = time.perf_counter() - start
                cpu[name] = cpu_seconds() - start_cpu
            rounds.append(times)
            cpus.append(cpu)
        persistent.clear()  # their workers exit when the loaders' iterators are collected

        def median_ratio(slow: str, fast: str) -> float:
            return statistics.median(r[slow] / r[fast] for r in rounds)

        print(f"{args.shards} shards ({args.writer}), {total_samples} samples, {total_mb:.1f} MB, "
              f"text {args.text_bytes} B/sample, batches of {BATCH}; medians of {args.rounds} interleaved rounds; "
              f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
        for name in runs:
            if name in (BUSY_ONE, BUSY_FOUR):
                continue
            seconds = statistics.median(r[name] for r in rounds)
            print(f"{name:<60} {total_mb / seconds:9.1f} MB/s {total_samples / seconds:12.0f} samples/s")
        if not args.no_ceph:
            ceph_bytes_ratio(manifest, 4)
        print(f"speedup_vs_webdataset_stripped_down: "
              f"{median_ratio('webdataset defaults (0 workers)', 'ReleaseDataset stripped-down, per-sample dicts (0 workers)'):.2f}")
        print(f"workers_scaling_list_batches: "
              f"{median_ratio('ReleaseDataset defaults, list batches (1 worker)', 'ReleaseDataset defaults, list batches (4 workers)'):.2f}")
        print(f"speedup_vs_webdataset_defaults_0_workers: "
              f"{median_ratio('webdataset defaults (0 workers)', 'ReleaseDataset defaults (0 workers)'):.2f}")
        print(f"speedup_vs_webdataset_defaults_2_workers: "
              f"{median_ratio('webdataset defaults (2 workers)', 'ReleaseDataset defaults (2 workers)'):.2f}")
        print(f"speedup_vs_webdataset_first_read_0_workers (shards not yet verified): "
              f"{median_ratio('webdataset defaults (0 workers)', 'ReleaseDataset defaults, shards not yet verified (0 workers)'):.2f}")
        print(f"speedup_vs_webdataset_first_read_2_workers (shards not yet verified): "
              f"{median_ratio('webdataset defaults (2 workers)', 'ReleaseDataset defaults, shards not yet verified (2 workers)'):.2f}")
        print_cpu("workers_scaling", "ReleaseDataset defaults (1 worker)", "ReleaseDataset defaults (4 workers)",
                  {name: statistics.median(r[name] for r in rounds) for name in runs},
                  {name: statistics.median(c[name] for c in cpus) for name in runs}, torch_worker_cpu(args.rounds))
        print_busy("workers_scaling", busy_seconds, batches, statistics.median(c[BUSY_ONE] for c in cpus),
                   statistics.median(c[BUSY_FOUR] for c in cpus), median_ratio(BUSY_ONE, BUSY_FOUR))
        print(f"workers_scaling: "
              f"{median_ratio('ReleaseDataset defaults (1 worker)', 'ReleaseDataset defaults (4 workers)'):.2f}")
        print(f"workers_scaling_persistent_workers (persistent_workers=True, set_epoch per epoch; not the goal's "
              f"fresh workers): "
              f"{median_ratio('ReleaseDataset defaults, persistent workers (1 worker)', 'ReleaseDataset defaults, persistent workers (4 workers)'):.2f}")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # delta-rs and s3fs's event loop thread can abort or complain at interpreter exit

"""ReleaseDataset: a torch IterableDataset over a release's shards, exactly-once, deterministic and resumable.

The order and the rank/worker split live in ``plan``; shard bytes come from ``ShardSource``
(tiers, cache, checksums) through a ``Prefetcher``; ``tar_index`` gives random access inside a
shard. Torch is optional: without it the class is a plain iterable with the same API.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.strings  # noqa: F401  numpy imports it lazily; index_tar uses it on tars without an embedded index
# (webdataset's, the tests' writer): loaded here, forked DataLoader workers inherit it (~2 ms CPU per worker, measured)

from datahub.loader.decode import (BatchFormat, DecodeMode, SampleReader, TextColumns, arrow_batch_from_columns,
                                   make_decoder)
from datahub.loader.errors import ConsumedCountRequiredError
from datahub.loader.manifest import load_manifest
from datahub.shards.manifest import Manifest
from datahub.loader.plan import (EpochOrder, RankStream, Segment, Uneven, consumed_items, rank_stream, resolve_topology,
                                 int_setting, require_state, stream_positions, worker_pieces)
from datahub.loader.prefetch import Prefetcher
from datahub.loader.read_policy import ReadPolicy
from datahub.loader.shard_source import ShardSource, Verify
from datahub.loader.regions import region_preference
from datahub.loader.storage_options import StorageArg, as_storage, readable_tiers, tier_list, tier_options
from datahub.loader.storage_options import manifest_options as manifest_options_for
from datahub.shards.index import index_tar
from datahub.loader import worker_transport
from datahub.loader.worker_use import OwnPosition, TrainerPosition, WorkerUse

try:  # a real IterableDataset when torch is installed (DataLoader workers, StatefulDataLoader)
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data import get_worker_info as _get_worker_info
except ImportError:  # pragma: no cover - exercised in the no-torch test via a subprocess
    _Base = object  # type: ignore[assignment,misc]  # torch is an optional extra: a plain iterable then

    def _get_worker_info() -> Any:
        return None


STATE_FORMAT = "datahub.loader/3"
# /1 replayed a drop-mode elastic segment without its unread tail; /1 and /2 shuffled within blocks that did not
# follow shard bounds (/3's blocks are whole shards, so DataLoader workers can read disjoint shards)
_OLD_STATE_FORMAT = "datahub.loader/1"
_OLD_STATE_FORMATS = (_OLD_STATE_FORMAT, "datahub.loader/2")
_CHUNK_ITEMS = 1 << 16  # plan this many rank items at a time: bounded memory on billion-sample releases


class ReleaseDataset(OwnPosition, _Base):  # type: ignore[misc,valid-type]  # the base is torch's IterableDataset, or object without torch
    """Iterate one rank's share of a release: each sample exactly once per epoch over all ranks and workers.

    Every rank gets the same number of items; ``uneven="pad"`` (default) repeats a sample on
    short ranks and marks it ``is_padding=True`` (mask its loss), ``uneven="drop"`` leaves the
    last ``num_samples % world_size`` positions of the epoch's order unread (after an elastic resume, only
    the new cut's remainder: see ``datahub.loader.plan``). Call ``set_epoch``
    at each epoch start, as with DistributedSampler. ``state_dict``/``load_state_dict`` resume
    mid-epoch in O(1); see ``datahub.loader.plan`` for the elastic (new world size) rule.

    ``storage``: ``{tier: fsspec options}``, or the ``StorageConfig`` / storage YAML path the export used
    (credentials then come from the env variables or file each tier names; only tiers the loader may read
    are resolved). ``region``: replicas on tiers labelled with this region are read first, the others are the
    failover (default ``DATAHUB_REGION``; needs ``region:`` labels in the storage config; an explicit
    ``tier_preference`` wins; ``datahub.loader.regions``). ``read_policy``: connect/read timeouts, bounded retries
    and tier cooldown for remote reads
    (``datahub.loader.read_policy``). ``verify``: True checks size and sha256, hashing a local file once per
    identity (device, inode, size, mtime, ctime) per verdict store (``verdicts_dir``, default ``cache_dir/.verified``
    or ``~/.cache/datahub/verified``: kept across epochs, DataLoader workers and runs; ``datahub.loader.verified``);
    "always" hashes every read; False checks the size only.

    DataLoader workers: each reads its own contiguous piece of the rank's stream, cut between shuffle blocks of
    whole shards, so every shard is fetched once per epoch whatever ``num_workers`` (see ``datahub.loader.plan``).
    ``batch_size=N, batch_format="arrow"`` yields ``pyarrow.RecordBatch``es (sample_id, text, is_padding) that cross
    the worker boundary as one write to shared memory (``datahub.loader.worker_transport``): the fast way to feed a tokenizer (``DataLoader(dataset, batch_size=None)``
    passes them through untouched).
    ``transform``: a callable applied to every decoded sample (after ``decode``, before batching), in the
    worker that reads it, e.g. ``decode="pil", transform=lambda s: augment(s["image"])``.
    """

    def __init__(
        self,
        release_or_manifest: str | Mapping[str, Any] | Manifest,
        *,
        lake: str | os.PathLike[str] | None = None,
        storage: StorageArg = None,
        tier_preference: Sequence[str] | None = None,
        region: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        shuffle_buffer: int = 8192,
        decode: DecodeMode | Callable[[dict[str, Any]], Any] = "text",
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        batch_format: BatchFormat = "list",
        uneven: Uneven = "pad",
        prefetch_shards: int = 2,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit_bytes: int | None = None,
        verify: Verify = True,
        read_policy: ReadPolicy | None = None,
        verdicts_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if uneven not in ("pad", "drop"):
            raise ValueError(f"uneven must be 'pad' or 'drop'; got {uneven!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None; got {batch_size}")
        if batch_format not in ("list", "arrow"):
            raise ValueError(f"batch_format must be 'list' or 'arrow'; got {batch_format!r}")
        if batch_format == "arrow" and (batch_size is None or decode != "text" or transform is not None):
            raise ValueError("batch_format='arrow' makes pyarrow RecordBatches of text: it needs batch_size=N and "
                             f"decode='text' (got batch_size={batch_size}, decode={decode!r})")
        storage_config = as_storage(storage)
        manifest_options = None
        if isinstance(release_or_manifest, str) and "://" in release_or_manifest:  # a manifest URI on an object store
            manifest_options = manifest_options_for(storage_config, release_or_manifest)
        self.manifest = load_manifest(release_or_manifest, lake=lake, storage_options=manifest_options,
                                      read_policy=read_policy)
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self.seed, self.epoch = int_setting("seed", seed), int_setting("epoch", epoch)
        self.shuffle, self.shuffle_buffer = shuffle, int_setting("shuffle_buffer", shuffle_buffer or 0, minimum=0)
        self.batch_size, self.uneven = batch_size, uneven
        self.prefetch_shards = int_setting("prefetch_shards", prefetch_shards, minimum=0)
        self.batch_format = batch_format
        self._decode = make_decoder(decode)  # per-sample reads; arrow batches gather columns (_iterate_arrow)
        if transform is not None:  # applied to every decoded sample, before batching (e.g. image augmentation)
            self._decode = _Transformed(self._decode, transform)
        tier_preference = tier_list(tier_preference)  # "cfs" alone is ["cfs"]
        if tier_preference is None:  # the reader's region's replicas first, the others as failover
            tier_preference = region_preference(readable_tiers(self.manifest, None), storage_config, region)
        self.source = ShardSource(self.manifest, tier_preference=tier_preference,
                                  storage=tier_options(storage_config, tiers=readable_tiers(self.manifest, tier_preference)),
                                  cache_dir=cache_dir, cache_limit_bytes=cache_limit_bytes, verify=verify,
                                  read_policy=read_policy, verdicts_dir=verdicts_dir)
        self._segments: list[Segment] = []  # past (world_size, samples per rank, num_workers, trainer items)
        self._start = 0  # samples of this rank's stream already consumed before this iteration
        self._pending: tuple[int, int] | None = None  # (num_workers, trainer items) read by workers after _start
        self._items = 0  # items yielded by the live iterator in this process
        self._worker_resume: dict[str, int] | None = None
        self._consumed = 0  # samples yielded by the live iterator in this process
        self._worker: tuple[int, int] | None = None  # (worker_id, num_workers) when inside a DataLoader worker
        self._worker_items = 0  # items yielded before the live iterator, plus its batches (samples count via _consumed)
        self._worker_use = WorkerUse()  # set by DataLoader workers: then this process's own count means nothing
        self._position = TrainerPosition()  # set_epoch/load_state_dict here, for persistent DataLoader workers

    # the attributes set_epoch and load_state_dict set: a persistent DataLoader worker's copy takes them at __iter__
    _position_fields = ("epoch", "_segments", "_start", "_pending", "_worker_resume", "_consumed", "_items")

    def _before_load(self) -> None:
        """At the start of load_state_dict: in a worker (StatefulDataLoader loading the worker's state), the position
        the copy had, which a persistent worker takes back after the pass that state is for."""
        if _get_worker_info() is not None:
            self._position.before_worker_load({name: getattr(self, name) for name in self._position_fields})

    def _position_changed(self) -> None:
        """After set_epoch/load_state_dict: in the owner, publish the position to persistent workers; in a worker
        (StatefulDataLoader loading the worker's state), keep it over what the owner published before."""
        if _get_worker_info() is None:
            self._position.publish({name: getattr(self, name) for name in self._position_fields})
            worker_transport.release_finished_rings()  # the last epoch's rings, before new workers make theirs
        else:
            self._position.catch_up()

    # --- plan -------------------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (clears a loaded resume point)."""
        self.epoch = int(epoch)
        self._segments, self._start, self._worker_resume, self._consumed = [], 0, None, 0
        self._pending, self._items = None, 0
        self._position_changed()

    def _order(self) -> EpochOrder:
        return EpochOrder([shard.samples for shard in self.manifest.shards], digest=self.manifest.release_digest,
                          seed=self.seed, epoch=self.epoch, shuffle=self.shuffle, shuffle_buffer=self.shuffle_buffer)

    def _plan(self, num_workers: int) -> tuple[list[Segment], int, tuple[int, int] | None]:
        """(past segments, start, pending workers' consumption) for iterating with ``num_workers``: a loaded state
        whose workers' items were read with another number of workers becomes a past segment (re-cut, exactly once)."""
        segments, start, pending = list(self._segments), self._start, self._pending
        if pending is not None and pending[0] != max(1, num_workers):
            segments.append((self.world_size, start, *pending))
            start, pending = 0, None
        return segments, start, pending

    def _stream(self, segments: list[Segment] | None = None, order: EpochOrder | None = None) -> RankStream:
        order = order or self._order()
        return rank_stream(self.manifest.num_samples, segments=self._segments if segments is None else segments,
                           world_size=self.world_size, rank=self.rank, uneven=self.uneven, batch_size=self.batch_size,
                           boundaries=order.boundaries)

    def _known_workers(self) -> int:
        if self._worker is not None:
            return self._worker[1]
        return self._worker_use.workers() or 1

    def _pieces(self, num_workers: int) -> tuple[RankStream, list[np.ndarray], int, list[int], EpochOrder]:
        """This rank's stream from its start, the workers' pieces of it, the piece worker 0 reads next (pieces rotate
        so that a resumed DataLoader continues the interleaving where it stopped) and each piece's first item."""
        order = self._order()
        segments, start, pending = self._plan(num_workers)
        stream = self._stream(segments, order).tail(start)
        pieces = worker_pieces(stream, num_workers, self.batch_size, order.boundaries)
        done, following = [0] * len(pieces), 0
        if pending is not None:
            done, following = consumed_items([len(bounds) - 1 for bounds in pieces], pending[1])
        return stream, pieces, following, done, order

    def __len__(self) -> int:
        """Items (samples, or batches when batch_size is set) this rank yields from the current start point, with the
        number of DataLoader workers that last iterated it (1 before any did)."""
        _, pieces, _, done, _ = self._pieces(self._known_workers())
        return sum(len(bounds) - 1 - first for bounds, first in zip(pieces, done))

    # --- resume -----------------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Position of this rank in the epoch, the same dict on every rank in synchronous training.

        ``consumed``: items (samples, or batches when batch_size is set) the trainer received from the
        current iteration; needed with a plain DataLoader with workers, whose dataset copies run in other
        processes. Without it, the count this process yielded is used (num_workers=0, or inside a
        StatefulDataLoader worker, which then also records the worker's own position); in a process whose
        copy of the dataset DataLoader workers iterate, that count is not the trainer's, so omitting
        ``consumed`` there raises ``ConsumedCountRequiredError`` rather than record a wrong position.
        """
        if consumed is None and self._worker is None and self._worker_use.seen():
            size = "batches" if self.batch_size else "samples"
            raise ConsumedCountRequiredError(
                f"ReleaseDataset.state_dict(): DataLoader worker processes read this dataset, so this process "
                f"does not know how many items the trainer received (it would record 0 and a resume would repeat "
                f"them). Pass state_dict(consumed=N), N = the {size} the DataLoader gave the trainer since the epoch "
                "(or the last load_state_dict) began, e.g. step + 1; or iterate a "
                "torchdata.stateful_dataloader.StatefulDataLoader and save its state_dict() instead")
        num_workers = self._known_workers() if consumed is not None or self._worker is not None else 1
        segments, start, pending = self._plan(num_workers)
        state: dict[str, Any] = {
            "format": STATE_FORMAT, "release": self.manifest.release, "release_digest": self.manifest.release_digest,
            "seed": self.seed, "epoch": self.epoch, "shuffle": self.shuffle, "shuffle_buffer": self.shuffle_buffer,
            "uneven": self.uneven, "batch_size": self.batch_size, "world_size": self.world_size,
            "segments": [list(segment) for segment in segments], "consumed": start,
        }
        if self._worker is not None and consumed is None:  # inside a StatefulDataLoader worker: its own position
            worker_id, num_workers = self._worker
            if pending is not None:
                state["workers"], state["items"] = pending
            items = self._worker_items + (self._consumed if self.batch_size is None else 0)
            state["worker"] = {"worker_id": worker_id, "num_workers": num_workers, "items": items}
            return state
        if num_workers <= 1:  # one stream: the trainer's items are a prefix of it
            if consumed is None:
                samples = self._consumed
            else:
                samples = min(consumed * (self.batch_size or 1), max(0, len(self._stream(segments)) - start))
            state["consumed"] = start + samples
        else:  # the trainer's items interleave the workers' pieces; each rank derives its pieces' prefixes from them
            state["workers"] = num_workers
            state["items"] = (pending[1] if pending is not None else 0) + int(consumed or 0)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state``; with another world size the rest of the epoch is re-cut over the new ranks."""
        require_state(self, state)
        if state.get("format") not in (STATE_FORMAT, *_OLD_STATE_FORMATS):
            raise ValueError(f"not a ReleaseDataset state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        if state["format"] == _OLD_STATE_FORMAT and state.get("uneven") == "drop" and state.get("segments"):
            raise ValueError(f"cannot resume a {_OLD_STATE_FORMAT} drop-mode state taken after an elastic resume: "
                             "this version keeps the old world size's unread tail, so the positions differ; "
                             "finish the epoch with the datahub version that wrote it, or restart the epoch")
        if state["format"] in _OLD_STATE_FORMATS and state.get("shuffle") and int(state.get("shuffle_buffer") or 0) > 1:
            raise ValueError(f"cannot resume a shuffled {state['format']} state: {STATE_FORMAT} shuffles within blocks "
                             "of whole shards (so DataLoader workers read disjoint shards), so the order differs; "
                             "finish the epoch with the datahub version that wrote it, or restart the epoch (set_epoch)")
        mine = {"release_digest": self.manifest.release_digest, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "uneven": self.uneven, "batch_size": self.batch_size}
        clashes = [f"{key}: checkpoint {state[key]!r}, dataset {value!r}" for key, value in mine.items() if state[key] != value]
        if clashes:
            raise ValueError("cannot resume: the checkpoint was taken with a different order (" + "; ".join(clashes)
                             + "); construct the ReleaseDataset with the checkpoint's settings")
        if int(state["world_size"]) != self.world_size and "worker" in state:  # refused before anything changes
            raise ValueError("cannot resume a StatefulDataLoader worker state with a different world size; "
                             "save ReleaseDataset.state_dict(consumed=...) per rank for elastic resumes")
        self._before_load()
        self.epoch = int(state["epoch"])
        # a /2 segment is (world_size, samples consumed per rank): read by one worker per rank, or in-process
        self._segments = [(int(w), int(n), int(rest[0]) if rest else 1, int(rest[1]) if rest else 0)
                          for w, n, *rest in state["segments"]]
        self._consumed, self._items = 0, 0
        self._worker_resume = dict(state["worker"]) if "worker" in state else None
        pending = (int(state["workers"]), int(state["items"])) if int(state.get("workers") or 1) > 1 else None
        if int(state["world_size"]) == self.world_size:
            self._start, self._pending = int(state["consumed"]), pending
        else:
            self._segments.append((int(state["world_size"]), int(state["consumed"]), *(pending or (1, 0))))
            self._start, self._pending = 0, None
        self._position_changed()

    # --- iteration --------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = _get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._worker = (worker_id, num_workers) if info is not None else None
        if info is None:
            self._worker_use.iterated_here(self._position.generation)  # this process's count is the trainer's again
        else:
            fields = self._position.next_pass()  # a persistent worker: the owner's set_epoch/load_state_dict since
            if fields is not None:
                for name, value in fields.items():
                    setattr(self, name, value)
            self._worker_use.mark(num_workers, self._position.generation)
            worker_transport.install()  # arrow batches to the trainer through shared memory, not the result pipe
        stream, pieces, following, done, order = self._pieces(num_workers)
        piece = (following + worker_id) % len(pieces)
        first = done[piece]
        if self._worker_resume is not None:
            resume = self._worker_resume
            if (resume["worker_id"], resume["num_workers"]) != (worker_id, num_workers):
                raise ValueError(f"worker state is for worker {resume['worker_id']} of {resume['num_workers']}, "
                                 f"loaded into worker {worker_id} of {num_workers}; keep num_workers when resuming")
            first = int(resume["items"])
        self._consumed, self._worker_items = 0, first
        return self._iterate(stream, order, pieces[piece], first)

    def _worker_chunks(self, stream: RankStream, order: EpochOrder, bounds: np.ndarray, first: int
                       ) -> Iterator[tuple[list[int], list[int], list[bool], list[int], list[int]]]:
        """This worker's samples in chunks: (shard ids, sample indexes, padding flags, per-item sample counts,
        run starts), where a run is a stretch of consecutive samples from one shard (the list ends with the length).
        ``bounds``: the worker's piece of the stream as item bounds; ``first``: the first item to read."""
        for lo in range(first, len(bounds) - 1, _CHUNK_ITEMS):
            chunk = bounds[lo : lo + _CHUNK_ITEMS + 1]
            offsets = np.arange(chunk[0], chunk[-1], dtype=np.int64)
            counts = np.diff(chunk)
            positions, padding = stream_positions(stream, offsets)
            shards, indexes = order.lookup(positions)
            switches = np.flatnonzero(shards[1:] != shards[:-1]) + 1
            runs = np.concatenate(([0], switches, [len(shards)])) if len(shards) else np.zeros(1, np.int64)
            yield shards.tolist(), indexes.tolist(), padding.tolist(), counts.tolist(), runs.tolist()

    def _iterate(self, stream: RankStream, order: EpochOrder, bounds: np.ndarray, first: int) -> Iterator[Any]:
        if self.batch_format == "arrow":
            return self._iterate_arrow(stream, order, bounds, first)
        return self._iterate_samples(stream, order, bounds, first)

    def _arrow_chunks(self, stream: RankStream, order: EpochOrder, bounds: np.ndarray, first: int
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]]:
        """``_worker_chunks`` as arrays: (shard ids, sample indexes, padding flags, each item's end in the chunk)."""
        for lo in range(first, len(bounds) - 1, _CHUNK_ITEMS):
            chunk = bounds[lo : lo + _CHUNK_ITEMS + 1]
            positions, padding = stream_positions(stream, np.arange(chunk[0], chunk[-1], dtype=np.int64))
            shards, indexes = order.lookup(positions)
            yield shards, indexes, padding, (chunk[1:] - chunk[0]).tolist()

    def _iterate_arrow(self, stream: RankStream, order: EpochOrder, bounds: np.ndarray, first: int
                       ) -> Iterator[Any]:
        """Arrow batches with no Python call per sample: when a shard is opened, the text bounds of all its samples in
        the chunk are gathered with numpy; a batch is then C-level maps over its samples' views and one join."""
        names = [shard.name for shard in self.manifest.shards]
        prefetcher = Prefetcher(self.source.read_buffer, depth=self.prefetch_shards, threads=2)
        opened: dict[int, TextColumns] = {}  # shards in use
        views: list[Any] = [None] * len(names)  # their bytes (memoryview) and sample keys (list), by shard id
        keys: list[Any] = [None] * len(names)
        getitem = operator.getitem
        chunks = self._arrow_chunks(stream, order, bounds, first)
        upcoming = next(chunks, None)
        if upcoming is not None:
            prefetcher.schedule(dict.fromkeys(upcoming[0].tolist()))
        try:
            while upcoming is not None:
                shards, indexes, padding, ends = upcoming
                upcoming = next(chunks, None)
                later = set(upcoming[0].tolist()) if upcoming is not None else set()
                if upcoming is not None:
                    # skip this chunk's own shards too: they are already scheduled (maybe not yet opened) and stay
                    # open into the next chunk; scheduled twice, the copy would be read again and never taken
                    current = set(shards.tolist())
                    prefetcher.schedule(s for s in dict.fromkeys(upcoming[0].tolist())
                                        if views[s] is None and s not in current)
                count = len(shards)
                # a shard is released after its last use in this chunk, unless the next chunk needs it too
                distinct, last_reversed = np.unique(shards[::-1], return_index=True)
                release_at = dict(zip(distinct.tolist(), (count - last_reversed).tolist()))
                starts = np.zeros(count, dtype=np.int64)
                stops = np.zeros(count, dtype=np.int64)
                filled: set[int] = set()
                shard_list, index_list = shards.tolist(), indexes.tolist()
                begin = 0
                for end in ends:
                    batch_shards = shard_list[begin:end]
                    for shard in dict.fromkeys(batch_shards):
                        if shard in filled:
                            continue
                        columns = opened.get(shard)
                        if columns is None:
                            data = prefetcher.take(shard)
                            columns = TextColumns(index_tar(data, where=names[shard]), memoryview(data), names[shard])
                            del data  # the columns hold the shard now; a release frees it
                            opened[shard], views[shard], keys[shard] = columns, columns.view, columns.keys
                        at = np.flatnonzero(shards == shard)
                        mine = indexes[at]
                        problem = columns.missing(mine)
                        if problem is not None:
                            raise problem
                        starts[at], stops[at] = columns.starts[mine], columns.stops[mine]
                        filled.add(shard)
                    texts = cast(list[memoryview], list(map(getitem, map(views.__getitem__, batch_shards),
                                                            map(slice, starts[begin:end].tolist(), stops[begin:end].tolist()))))
                    ids = cast(list[str], list(map(getitem, map(keys.__getitem__, batch_shards), index_list[begin:end])))
                    out = arrow_batch_from_columns(ids, texts, stops[begin:end] - starts[begin:end], padding[begin:end])
                    del texts
                    for shard in dict.fromkeys(batch_shards):
                        if release_at[shard] <= end and shard not in later:
                            del opened[shard]
                            views[shard] = keys[shard] = None
                    self._consumed += end - begin
                    self._worker_items += 1
                    self._items += 1
                    begin = end
                    yield out
        finally:
            opened.clear()
            views.clear()
            prefetcher.close()

    def _iterate_samples(self, stream: RankStream, order: EpochOrder, bounds: np.ndarray, first: int
                         ) -> Iterator[Any]:
        names = [shard.name for shard in self.manifest.shards]
        decode, batch_size = self._decode, self.batch_size
        prefetcher = Prefetcher(self.source.read_buffer, depth=self.prefetch_shards, threads=2)
        readers: dict[int, SampleReader] = {}  # shards in use: sample reader bound to the shard's index and bytes
        chunks = self._worker_chunks(stream, order, bounds, first)
        upcoming = next(chunks, None)
        if upcoming is not None:
            prefetcher.schedule(dict.fromkeys(upcoming[0]))
        try:
            while upcoming is not None:
                shards, indexes, padding, counts, runs = upcoming
                upcoming = next(chunks, None)
                later = set(upcoming[0]) if upcoming is not None else set()
                if upcoming is not None:
                    # skip this chunk's own shards too (see _iterate_arrow)
                    in_chunk = set(shards)
                    prefetcher.schedule(s for s in dict.fromkeys(upcoming[0]) if s not in readers and s not in in_chunk)
                # a shard is released at the first switch after its last use in this chunk, unless the
                # next chunk needs it too: at most the shards of one shuffle block stay in memory
                last_use = dict(zip(shards, range(len(shards))))
                current = -1
                batch: list[Any] = []
                item = 0
                for begin, end in zip(runs, runs[1:]):  # one shard per run: the per-sample loop is one map
                    shard = shards[begin]
                    if current >= 0 and last_use[current] < begin and current not in later:
                        del readers[current]
                    read = readers.get(shard)
                    if read is None:
                        data = prefetcher.take(shard)
                        read = readers[shard] = decode(index_tar(data, where=names[shard]), memoryview(data), names[shard])
                        del data  # the reader holds the shard now; a release frees it
                    current = shard
                    if batch_size is None:
                        for sample in map(read, indexes[begin:end], padding[begin:end]):
                            self._consumed += 1
                            self._items += 1
                            yield sample
                        continue
                    while begin < end:
                        stop = min(end, begin + counts[item] - len(batch))
                        batch.extend(map(read, indexes[begin:stop], padding[begin:stop]))
                        begin = stop
                        if len(batch) == counts[item]:
                            self._consumed += len(batch)
                            self._worker_items += 1
                            self._items += 1
                            item += 1
                            out, batch = batch, []
                            yield out
                for shard in [s for s in readers if s not in later]:
                    del readers[shard]
        finally:
            readers.clear()
            prefetcher.close()


class _Transformed:
    """A decoder whose samples go through ``transform`` (a class, not a closure: picklable for spawned workers)."""

    def __init__(self, decoder: Callable[[Any, memoryview, str], Callable[[int, bool], Any]],
                 transform: Callable[[Any], Any]) -> None:
        self.decoder, self.transform = decoder, transform

    def __call__(self, index: Any, data: memoryview, name: str) -> Callable[[int, bool], Any]:
        read, transform = self.decoder(index, data, name), self.transform
        return lambda i, pad: transform(read(i, pad))

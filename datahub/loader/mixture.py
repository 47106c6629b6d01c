"""MixtureDataset: a weighted read-time mixture of releases, exactly-once per source, resumable with new weights.

Each source keeps its own epoch order (a ``ReleaseDataset``'s block-shuffled samples, or a ``PackedDataset``'s
packed sequences) and a cursor into it. The mixture is one global sequence that merges the sources' items by
weight, deterministically and without randomness: item ``j`` of source ``s`` (counted from the current weights'
start) gets the key ``(j + 0.5) / w_s`` and the sequence is every item in order of (key, source index). That is
stride scheduling, the same error-minimizing rule as Megatron-LM's ``BlendedDataset`` (``build_blending_indices``
picks the source furthest below its share), so every prefix of the mixture holds each source's share to within
one item. Weights are by items: samples for text sources, packed sequences of ``seq_len`` tokens for token
sources (so by tokens exactly). Each source is read exactly once per epoch: when one is used up, the others
continue at their weights (the epoch ends when all are used up); a source of weight 0 is not read (its cursor
stays, for a later change of weights). ``upsample={name: k}`` declares a source read
k times per epoch (k passes over its own epochs ``k * epoch + p``).

Ranks and DataLoader workers stride the global sequence (``datahub.loader.strided``), so the resume point is one
prefix of it, the same on every rank: ``state_dict`` records each source's cursor (samples or tokens consumed this
epoch) and the weights. Loaded with the same weights the mixture continues exactly; with new weights a new merge
starts from every source's cursor, so nothing is repeated or skipped; with another world size or
``num_workers`` the rest is re-strided.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from datahub.loader.dataset import ReleaseDataset
from datahub.loader.packing import PackedDataset, TokenBatch
from datahub.loader.plan import EpochOrder, require_state
from datahub.loader.strided import StridedDataset
from datahub.shards.index import index_tar

STATE_FORMAT = "datahub.loader.mixture/1"
_CHUNK = 1 << 16  # global items merged at a time while iterating


def merge_next(weights: np.ndarray, remaining: np.ndarray, done: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The next ``count`` items of the weighted merge: (source, item index since the weights' start) arrays.

    ``remaining[s]``: items source s has in this merge; ``done[s]``: items already taken. Items are ordered by
    (``(j + 0.5) / w_s``, s); candidates are drawn up to a bound and only those certainly before every item left
    out are taken, so the result does not depend on where a caller cuts its chunks."""
    sources: list[np.ndarray] = []
    indexes: list[np.ndarray] = []
    done = np.asarray(done, dtype=np.int64).copy()
    while count > 0:
        active = np.flatnonzero((done < remaining) & (weights > 0))
        if not len(active):
            break
        w = weights[active]
        following = (done[active] + 0.5) / w
        first = int(np.lexsort((active, following))[0])
        bound = float(following[first]) + (count + len(active)) / float(w.sum())
        upto = np.minimum(remaining[active], np.floor(bound * w - 0.5).astype(np.int64) + 1)
        upto = np.maximum(upto, done[active])
        upto[first] = max(int(upto[first]), int(done[active[first]]) + 1)
        sizes = upto - done[active]
        src = np.repeat(active, sizes)
        starts = np.cumsum(sizes) - sizes
        j = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(starts - done[active], sizes)
        keys = (j + 0.5) / weights[src]
        order = np.lexsort((src, keys))
        src, j, keys = src[order], j[order], keys[order]
        left_out = upto < remaining[active]  # each source's first item not drawn: nothing after it may be taken
        if left_out.any():
            cut_keys = (upto[left_out] + 0.5) / w[left_out]
            cut_sources = active[left_out]
            cut = int(np.lexsort((cut_sources, cut_keys))[0])
            cut_key, cut_source = cut_keys[cut], cut_sources[cut]
            take = int(np.count_nonzero((keys < cut_key) | ((keys == cut_key) & (src < cut_source))))
        else:
            take = len(src)
        take = min(take, count)
        sources.append(src[:take])
        indexes.append(j[:take])
        np.add.at(done, src[:take], 1)
        count -= take
    if not sources:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(sources), np.concatenate(indexes)


class _TextSource:
    """A ``ReleaseDataset``'s samples in its epoch order (G), read at any positions; cursor = samples consumed."""

    unit = "samples"

    def __init__(self, dataset: ReleaseDataset) -> None:
        self.dataset = dataset
        self.total = dataset.manifest.num_samples

    def identity(self) -> dict[str, Any]:
        ds = self.dataset
        return {"release_digest": ds.manifest.release_digest, "seed": ds.seed, "shuffle": ds.shuffle,
                "shuffle_buffer": ds.shuffle_buffer}

    def items(self, cursor: int) -> int:
        return max(0, self.total - cursor)

    def advance(self, cursor: int, items: int) -> int:
        return min(self.total, cursor + items)

    def reader(self, epoch: int, cursor: int) -> Callable[[np.ndarray, np.ndarray], list[Any]]:
        ds = self.dataset
        order = EpochOrder([shard.samples for shard in ds.manifest.shards], digest=ds.manifest.release_digest,
                           seed=ds.seed, epoch=epoch, shuffle=ds.shuffle, shuffle_buffer=ds.shuffle_buffer)
        names = [shard.name for shard in ds.manifest.shards]
        open_shards: OrderedDict[int, Any] = OrderedDict()  # the shards in use: a block's, in G order
        slots = np.searchsorted(order.shard_starts, order.boundaries)
        limit = int(np.diff(slots).max(initial=1)) + 2  # a block's shards, and the next block's first

        def read(indexes: np.ndarray, padding: np.ndarray) -> list[Any]:
            shards, positions = order.lookup(cursor + indexes)
            out = []
            for shard, position, pad in zip(shards.tolist(), positions.tolist(), padding.tolist()):
                sample = open_shards.get(shard)
                if sample is None:
                    data = ds.source.read_buffer(shard)
                    sample = open_shards[shard] = ds._decode(index_tar(data, where=names[shard]), memoryview(data),
                                                             names[shard])
                    while len(open_shards) > limit:
                        open_shards.popitem(last=False)
                else:
                    open_shards.move_to_end(shard)
                out.append(sample(position, pad))
            return out

        return read


class _TokenSource:
    """A ``PackedDataset``'s sequences from a token offset; cursor = tokens consumed."""

    unit = "tokens"

    def __init__(self, dataset: PackedDataset) -> None:
        self.dataset = dataset
        self.total = dataset.num_tokens

    def identity(self) -> dict[str, Any]:
        return {**self.dataset._identity(), "seq_len": self.dataset.seq_len}

    def items(self, cursor: int) -> int:
        return self.dataset.sequences_from(cursor)

    def advance(self, cursor: int, items: int) -> int:
        return min(self.total, cursor + items * self.dataset.seq_len)

    def reader(self, epoch: int, cursor: int) -> Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]:
        return self.dataset.sequence_reader(epoch, cursor)


class MixtureDataset(StridedDataset):
    """Iterate one rank's share of a weighted mixture of sources (all ``ReleaseDataset``s, or all ``PackedDataset``s
    with one ``seq_len``); each source's items exactly once per epoch (``upsample`` times when declared).

    The sources give the data and their own order settings (seed, shuffle, decode, tiers); their rank, world size
    and batch size are ignored: the mixture's apply. Text items are the sources' samples with a ``source`` key
    (lists of them with ``batch_size``); token items are ``TokenBatch``es with a ``source`` array (index into
    ``names``). See the module docstring for the merge and the resume rules.
    """

    _transfer_types = (TokenBatch,)  # made in the worker, sent through shared memory (worker_transport)
    _position_fields = (*StridedDataset._position_fields, "weights", "_done")

    def __init__(
        self,
        sources: Mapping[str, ReleaseDataset | PackedDataset],
        weights: Mapping[str, float],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        epoch: int = 0,
        batch_size: int | None = None,
        upsample: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(rank=rank, world_size=world_size, batch_size=batch_size)
        if not isinstance(sources, Mapping):
            raise TypeError("MixtureDataset sources must be a dict of name -> dataset, e.g. {'web': web, 'code': "
                            f"code}}, with weights by the same names; got {type(sources).__name__}")
        if not sources:
            raise ValueError("MixtureDataset needs at least one source")
        self.names = list(sources)
        kinds = {type(source) for source in sources.values()}
        if kinds <= {ReleaseDataset}:
            arrow = [name for name, source in sources.items() if getattr(source, "batch_format", "list") != "list"]
            if arrow:
                raise ValueError(f"text sources {arrow}: construct them with batch_format='list' (the mixture makes "
                                 "the batches; a sample is a dict with its source added)")
            self.kind = "text"
            self._sources: list[_TextSource | _TokenSource] = [_TextSource(s) for s in sources.values()]  # type: ignore[arg-type]
        elif kinds <= {PackedDataset}:
            self.kind = "tokens"
            self._sources = [_TokenSource(s) for s in sources.values()]  # type: ignore[arg-type]
            lengths = {s.seq_len for s in sources.values()}  # type: ignore[union-attr]
            if len(lengths) > 1:
                raise ValueError(f"token sources must share one seq_len to be mixed; got {sorted(lengths)}")
            # a batch holds one set of arrays: position_ids/segment_ids for every row or for none
            boundaries = {name: bool(s.document_boundaries) for name, s in sources.items()}  # type: ignore[union-attr]
            if len(set(boundaries.values())) > 1:
                raise ValueError(f"token sources must share one document_boundaries setting to be mixed; got "
                                 f"{boundaries}: construct every PackedDataset with the same value")
        else:
            raise ValueError("MixtureDataset mixes either ReleaseDatasets (text) or PackedDatasets (tokens), not both; "
                             f"got {sorted(k.__name__ for k in kinds)}")
        self.upsample = {name: int((upsample or {}).get(name, 1)) for name in self.names}
        unknown = set(upsample or {}) - set(self.names)
        if unknown or min(self.upsample.values()) < 1:
            raise ValueError(f"upsample: names must be sources and factors >= 1; got {dict(upsample or {})}")
        self.epoch = int(epoch)
        self.weights = self._check_weights(weights)
        self._start = [0] * len(self.names)  # per source: its cursor (in its passes) when the current weights began
        self._done = np.zeros(len(self.names), dtype=np.int64)  # items taken since then

    def _check_weights(self, weights: Mapping[str, float]) -> dict[str, float]:
        missing, unknown = set(self.names) - set(weights), set(weights) - set(self.names)
        if missing or unknown:
            raise ValueError(f"weights must name every source once: missing {sorted(missing)}, unknown {sorted(unknown)}")
        values = {name: float(weights[name]) for name in self.names}
        if any(not np.isfinite(v) or v < 0 for v in values.values()) or sum(values.values()) <= 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0; got {values}")
        total = sum(values.values())
        return {name: value / total for name, value in values.items()}

    # --- passes: a source's cursor runs over upsample x its epoch -----------------------------------------

    def _pass_total(self, s: int) -> int:
        return self._sources[s].total

    def _remaining(self) -> np.ndarray:
        """Items each source has from its start cursor to the end of its passes."""
        out = []
        for s, source in enumerate(self._sources):
            passes, start = self.upsample[self.names[s]], self._start[s]
            total = self._pass_total(s)
            current, within = divmod(start, total) if total else (passes, 0)
            left = 0 if current >= passes else source.items(within) + (passes - current - 1) * source.items(0)
            out.append(left)
        return np.asarray(out, dtype=np.int64)

    def _cursor(self, s: int, items: int) -> int:
        """Source s's cursor (over its passes) after ``items`` more items from its start cursor."""
        source, total = self._sources[s], self._pass_total(s)
        cursor = self._start[s]
        while items > 0 and total:
            current, within = divmod(cursor, total)
            step = min(items, source.items(within))
            if step == 0:
                break
            after = source.advance(within, step)
            cursor = current * total + after
            items -= step
            if after >= total:
                cursor = (current + 1) * total
        return cursor

    def _global_items(self) -> int:
        weighted = np.array([self.weights[name] > 0 for name in self.names])
        return int(((self._remaining() - self._done) * weighted).sum())

    def _reader(self) -> Callable[[np.ndarray, np.ndarray], Any]:
        weights = np.array([self.weights[name] for name in self.names], dtype=np.float64)
        remaining = self._remaining()
        readers: dict[tuple[int, int], Callable[[np.ndarray, np.ndarray], Any]] = {}
        window: dict[str, Any] = {"lo": 0, "done": self._done.copy(), "src": np.zeros(0, np.int64),
                                  "idx": np.zeros(0, np.int64)}
        first = merge_next(weights, remaining, self._done, 1)

        def schedule(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """(source, item since the start) of global offsets, which rise between calls in one worker."""
            hi = int(offsets.max()) + 1
            if int(offsets.min()) < window["lo"]:  # not expected: restart from the segment start
                window.update(lo=0, done=self._done.copy(), src=np.zeros(0, np.int64), idx=np.zeros(0, np.int64))
            while window["lo"] + len(window["src"]) < hi:
                # drop what lies before the request, then merge the next chunk
                keep = min(max(0, int(offsets.min()) - window["lo"]), len(window["src"]))
                window["lo"] += keep
                window["src"], window["idx"] = window["src"][keep:], window["idx"][keep:]
                src, idx = merge_next(weights, remaining, window["done"], max(_CHUNK, hi - window["lo"] - len(window["src"])))
                if not len(src):
                    break
                np.add.at(window["done"], src, 1)
                window["src"] = np.concatenate([window["src"], src])
                window["idx"] = np.concatenate([window["idx"], idx])
            at = offsets - window["lo"]
            return window["src"][at], window["idx"][at]

        def read_source(s: int, items: np.ndarray, padding: np.ndarray) -> Any:
            """Items of source s (indexes since its start cursor), across its passes."""
            source, total = self._sources[s], self._pass_total(s)
            cursors = np.array([self._cursor(s, 0)], dtype=np.int64)
            base = int(cursors[0])
            current, within = divmod(base, total)
            first_pass_items = source.items(within)
            pass_of = np.where(items < first_pass_items, 0, 1 + (items - first_pass_items) // max(source.items(0), 1))
            local = np.where(pass_of == 0, items, (items - first_pass_items) % max(source.items(0), 1))
            parts: list[tuple[np.ndarray, Any]] = []
            for p in np.unique(pass_of).tolist():
                rows = np.flatnonzero(pass_of == p)
                key = (s, current + p)
                if key not in readers:
                    upsample = self.upsample[self.names[s]]
                    readers[key] = source.reader(self.epoch * upsample + current + p, within if p == 0 else 0)
                parts.append((rows, readers[key](local[rows], padding[rows])))
            return parts

        def read(offsets: np.ndarray, padding: np.ndarray) -> Any:
            # padding items repeat the first item of this iteration (flagged); real ones follow the merge
            src = np.full(len(offsets), first[0][0] if len(first[0]) else 0, dtype=np.int64)
            idx = np.full(len(offsets), first[1][0] if len(first[1]) else 0, dtype=np.int64)
            real = ~padding
            if real.any():
                src[real], idx[real] = schedule(offsets[real])
            if self.kind == "tokens":
                batch: dict[str, np.ndarray] | None = None
                for s in np.unique(src).tolist():
                    rows = np.flatnonzero(src == s)
                    for sub, part in read_source(s, idx[rows], padding[rows]):
                        if batch is None:
                            batch = {key: np.empty((len(offsets), *value.shape[1:]), dtype=value.dtype)
                                     for key, value in part.items()}
                        for key, value in part.items():
                            if value.dtype != batch[key].dtype:  # sources with other token dtypes: widen
                                batch[key] = batch[key].astype(np.result_type(batch[key].dtype, value.dtype))
                            batch[key][rows[sub]] = value
                assert batch is not None
                batch["source"] = src.astype(np.int32)
                return TokenBatch(batch, single=self.batch_size is None)
            samples: list[Any] = [None] * len(offsets)
            for s in np.unique(src).tolist():
                rows = np.flatnonzero(src == s)
                for sub, part in read_source(s, idx[rows], padding[rows]):
                    for row, sample in zip(rows[sub].tolist(), part):
                        if isinstance(sample, dict):
                            sample["source"] = self.names[s]
                        samples[row] = sample
            return samples if self.batch_size is not None else samples[0]

        return read

    # --- epochs and resume ------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from the beginning of every source (the weights stay)."""
        self.epoch, self._yielded = int(epoch), 0
        self._start = [0] * len(self.names)
        self._done = np.zeros(len(self.names), dtype=np.int64)
        self._position_changed()

    def _done_after(self, items: int) -> np.ndarray:
        weights = np.array([self.weights[name] for name in self.names], dtype=np.float64)
        remaining, done = self._remaining(), self._done.copy()
        while items > 0:
            src, _ = merge_next(weights, remaining, done, min(items, 1 << 20))
            if not len(src):
                break
            done += np.bincount(src, minlength=len(self.names))
            items -= len(src)
        return done

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Every source's cursor and the weights, the same dict on every rank; ``consumed`` as for
        ``PackedDataset.state_dict`` (items the trainer received; needed with DataLoader workers)."""
        done = self._done_after(self.consumed_global(consumed))
        sources = {}
        for s, (name, source) in enumerate(zip(self.names, self._sources)):
            start = self._start[s]
            self_done = int(done[s])
            sources[name] = {"unit": source.unit, "start": start, "items": self_done,
                             "cursor": self._cursor(s, self_done), "total": source.total,
                             "upsample": self.upsample[name], **source.identity()}
        return self._add_worker_state({"format": STATE_FORMAT, "kind": self.kind, "epoch": self.epoch,
                                       "weights": dict(self.weights), "world_size": self.world_size,
                                       "sources": sources}, consumed)

    def load_state_dict(self, state: Mapping[str, Any], *, weights: Mapping[str, float] | None = None) -> None:
        """Continue at the state. With the state's weights (and ``weights`` not given) the merge continues exactly;
        with the dataset's own weights, when they differ from the state's, or with ``weights=``, a new merge starts
        at every source's cursor: no item is repeated or skipped."""
        require_state(self, state)
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a MixtureDataset state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        saved = state["sources"]
        if set(saved) != set(self.names):
            raise ValueError(f"cannot resume: the checkpoint mixes {sorted(saved)}, this dataset {sorted(self.names)}; "
                             "add a source with weight 0 to keep its cursor, or drop none")
        for s, (name, source) in enumerate(zip(self.names, self._sources)):
            identity = source.identity()
            clashes = [f"{key}: checkpoint {saved[name].get(key)!r}, dataset {value!r}"
                       for key, value in identity.items() if saved[name].get(key) != value]
            if int(saved[name]["upsample"]) != self.upsample[name]:
                clashes.append(f"upsample: checkpoint {saved[name]['upsample']}, dataset {self.upsample[name]}")
            if clashes:
                raise ValueError(f"cannot resume source {name!r}: " + "; ".join(clashes)
                                 + "; construct it with the checkpoint's settings")
        new = self._check_weights(weights) if weights is not None else self.weights
        same = all(abs(new[name] - float(state["weights"][name])) <= 1e-12 for name in self.names)
        if "worker" in state and not same:
            raise ValueError("cannot resume a StatefulDataLoader worker state with other weights; save "
                             "MixtureDataset.state_dict(consumed=...) to change weights at a resume")
        self._before_load()
        self._load_worker_state(state)  # the last check (the topology of a worker state): nothing changed before
        self.epoch, self._yielded = int(state["epoch"]), 0
        if same:
            self.weights = {name: float(state["weights"][name]) for name in self.names}
            self._start = [int(saved[name]["start"]) for name in self.names]
            self._done = np.array([int(saved[name]["items"]) for name in self.names], dtype=np.int64)
        else:
            self.weights = new
            self._start = [int(saved[name]["cursor"]) for name in self.names]
            self._done = np.zeros(len(self.names), dtype=np.int64)
        self._position_changed()

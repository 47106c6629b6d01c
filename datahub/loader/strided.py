"""The global-index rule shared by ``PackedDataset`` and ``MixtureDataset``: ranks and workers stride one sequence.

An epoch (after a resume point) is one global sequence of ``G`` items, the same on every rank. Rank ``r`` of
``W`` reads items ``r, r + W, r + 2W, ...``; every rank reads ``n = ceil(G / W)`` items, the short ones a padding
item at the end (flagged, masked out of the loss). With ``batch_size=B`` the rank's items are cut into batches
of ``B`` (the last may be short); DataLoader worker ``w`` of ``k`` makes the rank's batches ``w, w + k, ...``,
and since DataLoader takes one item from each worker in turn, the trainer receives the rank's batches in order
whatever ``num_workers``.

So after every rank received ``c`` items, the global items consumed are exactly the prefix ``[0, min(G, c * B * W))``:
the resume point is one number, independent of the world size and of ``num_workers``. Resuming with another
world size (elastic) or another ``num_workers`` strides the rest of the sequence with the new values: no item is
repeated or skipped. The subclass says what an item is and how a position in the sequence maps to data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from datahub.loader.errors import ConsumedCountRequiredError
from datahub.loader.plan import resolve_topology
from datahub.loader import worker_transport
from datahub.loader.worker_use import OwnPosition, TrainerPosition, WorkerUse

try:  # a real IterableDataset when torch is installed (DataLoader workers)
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data import get_worker_info as _get_worker_info
except ImportError:  # pragma: no cover - torch is an optional extra
    _Base = object  # type: ignore[assignment,misc]  # torch is an optional extra: a plain iterable then

    def _get_worker_info() -> Any:
        return None


class StridedDataset(OwnPosition, _Base):  # type: ignore[misc,valid-type]  # the base is torch's IterableDataset, or object
    """Rank/worker striding, batching and the consumed count over a subclass's global sequence.

    Subclasses implement ``_global_items()`` (G from the current resume point) and ``_reader()`` (a function from
    global offsets and a padding mask to one item or batch, made in the iterating process); their ``state_dict``
    turns ``consumed_global(consumed)`` into their own resume point.
    """

    def __init__(self, *, rank: int | None, world_size: int | None, batch_size: int | None) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None; got {batch_size}")
        self.rank, self.world_size = resolve_topology(rank, world_size)
        self.batch_size = batch_size
        self._yielded = 0  # items yielded by the live iterator in this process (num_workers=0)
        self._worker_use = WorkerUse()
        self._worker: tuple[int, int] | None = None  # (worker_id, num_workers) when inside a DataLoader worker
        self._worker_resume: dict[str, int] | None = None  # a StatefulDataLoader worker's own position, loaded
        self._position = TrainerPosition()  # set_epoch/load_state_dict here, for persistent DataLoader workers

    # --- subclass hooks ---------------------------------------------------------------------------------

    _transfer_types: tuple[type[worker_transport.ArrayBundle], ...] = ()  # item types sent through shared memory
    # the attributes set_epoch and load_state_dict set: a persistent DataLoader worker's copy takes them at __iter__
    _position_fields: tuple[str, ...] = ("epoch", "_start", "_yielded", "_worker_resume")

    def _global_items(self) -> int:
        raise NotImplementedError

    def _reader(self) -> Any:
        raise NotImplementedError

    # --- the rule ---------------------------------------------------------------------------------------

    def _rank_items(self) -> int:
        return -(-self._global_items() // self.world_size)

    def __len__(self) -> int:
        """Items (or batches) this rank yields from the resume point."""
        return -(-self._rank_items() // (self.batch_size or 1))

    def _offsets(self, item: int, count: int, total: int) -> tuple[np.ndarray, np.ndarray]:
        """Global offsets of the rank's items [item, item + count) and their padding mask."""
        offsets = self.rank + (item + np.arange(count, dtype=np.int64)) * self.world_size
        padding = offsets >= total
        return np.where(padding, 0, offsets), padding

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

    def __iter__(self) -> Iterator[Any]:
        info = _get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is None:
            self._worker_use.iterated_here(self._position.generation)
        else:
            fields = self._position.next_pass()  # a persistent worker: the owner's set_epoch/load_state_dict since
            if fields is not None:
                for name, value in fields.items():
                    setattr(self, name, value)
            self._worker_use.mark(num_workers, self._position.generation)
            worker_transport.install(self._transfer_types)  # batches to the trainer through shared memory
        self._worker = (worker_id, num_workers) if info is not None else None
        first, resume, self._worker_resume = 0, self._worker_resume, None  # a loaded worker position is used once
        if resume is not None:
            if (resume["worker_id"], resume["num_workers"]) != (worker_id, num_workers):
                raise ValueError(f"worker state is for worker {resume['worker_id']} of {resume['num_workers']}, "
                                 f"loaded into worker {worker_id} of {num_workers}; keep num_workers when resuming")
            first = int(resume["items"])
        self._yielded = first
        return self._iterate(worker_id + first * num_workers, num_workers)

    def _iterate(self, first_batch: int, step: int) -> Iterator[Any]:
        """The rank's batches ``first_batch``, ``first_batch + step``, ... (a worker's share)."""
        total = self._global_items()
        rank_items = -(-total // self.world_size)
        size = self.batch_size or 1
        batches = -(-rank_items // size)
        read = self._reader()
        for batch in range(first_batch, batches, step):
            first = batch * size
            offsets, padding = self._offsets(first, min(size, rank_items - first), total)
            out = read(offsets, padding)
            self._yielded += 1
            yield out

    def consumed_global(self, consumed: int | None) -> int:
        """Global items consumed when every rank received ``consumed`` items (default: this process's count).

        Inside a DataLoader worker (torchdata's StatefulDataLoader asks each worker's copy for ``state_dict()``) the
        shared part of the state stays at the resume point and ``_add_worker_state`` records the worker's own position."""
        if consumed is None and self._worker is not None:
            consumed = 0
        if consumed is None and self._worker_use.seen():
            raise ConsumedCountRequiredError(
                f"{type(self).__name__}.state_dict(): DataLoader worker processes read this dataset, so this process "
                "does not know how many items the trainer received. Pass state_dict(consumed=N), N = the items "
                "(batches when batch_size is set) the DataLoader gave the trainer since the epoch or the last "
                "load_state_dict began, e.g. step + 1")
        items = self._yielded if consumed is None else int(consumed)
        rank_items = min(items * (self.batch_size or 1), self._rank_items())
        return min(self._global_items(), rank_items * self.world_size)

    # --- StatefulDataLoader workers ---------------------------------------------------------------------

    def _add_worker_state(self, state: dict[str, Any], consumed: int | None) -> dict[str, Any]:
        """Inside a DataLoader worker (``consumed`` not given): add the worker's own position, which
        StatefulDataLoader hands back to the same worker on resume."""
        if self._worker is not None and consumed is None:
            worker_id, num_workers = self._worker
            state["worker"] = {"worker_id": worker_id, "num_workers": num_workers, "items": self._yielded,
                               "rank": self.rank, "batch_size": self.batch_size}
        return state

    def _load_worker_state(self, state: Mapping[str, Any]) -> None:
        """Keep a StatefulDataLoader worker's position; it continues the same striding, so the topology must match."""
        worker = state.get("worker")
        if worker is None:
            self._worker_resume = None
            return
        mine = {"world_size": self.world_size, "rank": self.rank, "batch_size": self.batch_size}
        theirs = {"world_size": state.get("world_size"), "rank": worker.get("rank"), "batch_size": worker.get("batch_size")}
        if mine != theirs:
            raise ValueError(f"cannot resume a StatefulDataLoader worker state with another topology (checkpoint "
                             f"{theirs}, dataset {mine}); save {type(self).__name__}.state_dict(consumed=...) for "
                             "elastic resumes")
        self._worker_resume = {key: int(worker[key]) for key in ("worker_id", "num_workers", "items")}

"""Plain Ray tasks over a list of items, small picklable results back in item order (QA's partial aggregates)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from datahub.engines.base import Engine


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def map_tasks(engine: Engine, items: Sequence[Any], fn: Callable[[Any], Any], *,
              workers: int | None = None) -> Iterator[Any]:
    """``fn(item)`` for every item in a Ray task, ``workers`` at once (default: the cluster's CPUs); results are
    yielded in item order, so a driver merging them sees the order a single process would. ``fn`` is put in the
    object store once (it may carry megabytes, e.g. a tokenizer), not pickled into every task."""
    import ray

    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    remote = ray.remote(_call)
    fn_ref = ray.put(fn)  # a top-level ObjectRef argument: each task gets the function itself
    pending: list[Any] = []
    try:
        for item in items:
            pending.append(remote.remote(fn_ref, item))
            if len(pending) > parallel:
                yield ray.get(pending.pop(0))
        while pending:
            yield ray.get(pending[0])
            pending.pop(0)
    finally:  # a task failed, or the caller stopped early: none may still run when the caller cleans up
        cancel_and_wait(pending)


def cancel_and_wait(refs: Sequence[Any], *, grace_s: float = 1.0, wait_s: float = 60.0) -> None:
    """Cancel tasks no longer wanted and return once none of them runs: a task left running keeps writing after its
    caller cleaned up (a failed Ray export's read tasks wrote their runs after the run folder was removed).
    Queued tasks never start; a running one gets Ray's KeyboardInterrupt and, still running after ``grace_s``, its
    worker is killed (Ray 2.60 did not interrupt a task blocked in a call within 30 s); ``wait_s`` bounds the wait
    for the kills."""
    import ray

    if not refs:
        return
    # never cancel a task that has ended (the failed one its caller just saw, among others): Ray 2.60's cancel can
    # race the task's own completion callback, which then finds the task gone and aborts the driver ("Check failed:
    # it != submissible_tasks_.end()", ray-project/ray#54846; seen here when the failed task's ref was cancelled)
    _, refs = ray.wait(list(refs), num_returns=len(refs), timeout=0, fetch_local=False)
    if not refs:
        return
    for ref in refs:
        ray.cancel(ref)
    _, running = ray.wait(list(refs), num_returns=len(refs), timeout=grace_s, fetch_local=False)
    for ref in running:
        ray.cancel(ref, force=True)
    if running:
        ray.wait(running, num_returns=len(running), timeout=wait_s, fetch_local=False)


def _map_split(fn: Callable[[Any], tuple[Any, Sequence[Any]]], item: Any) -> tuple[Any, ...]:
    small, parts = fn(item)
    return (small, *parts)


def _reduce(fn: Callable[[list[Any]], Any], *parts: Any) -> Any:
    return fn(list(parts))


def map_reduce(engine: Engine, items: Sequence[Any], map_fn: Callable[[Any], tuple[Any, Sequence[Any]]],
               reduce_fn: Callable[[list[Any]], Any], *, partitions: int,
               workers: int | None = None) -> tuple[list[Any], list[Any]]:
    """``map_fn(item)`` -> (a small result, ``partitions`` parts) in a Ray task per item, ``workers`` at once; the
    parts stay in the object store and ``reduce_fn`` gets part p of every item in the p-th reduce task. Returns the
    small results in item order and the reduce results in partition order; no part passes through the driver. A
    failed task (or an error in the driver) cancels the other tasks of both rounds before the error propagates.
    Both functions are put in the object store once, not pickled into every task."""
    import ray

    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    mapper = ray.remote(_map_split).options(num_returns=partitions + 1)
    map_ref, reduce_ref = ray.put(map_fn), ray.put(reduce_fn)
    smalls: list[Any] = []
    parts: list[list[Any]] = [[] for _ in range(partitions)]
    pending: list[Any] = []  # map tasks (their small results) and then reduce tasks, not yet got
    try:
        for item in items:
            refs: list[Any] = mapper.remote(map_ref, item)  # type: ignore[assignment]  # num_returns > 1: a list
            pending.append(refs[0])
            for p in range(partitions):
                parts[p].append(refs[p + 1])
            if len(pending) > parallel:
                smalls.append(ray.get(pending[0]))
                pending.pop(0)
        while pending:
            smalls.append(ray.get(pending[0]))
            pending.pop(0)
        reducer = ray.remote(_reduce)
        pending = [reducer.remote(reduce_ref, *parts[p]) for p in range(partitions)]
        del parts  # the reduce tasks hold the parts now
        partition = {ref: p for p, ref in enumerate(pending)}
        reduced: list[Any] = [None] * partitions
        while pending:  # as they finish: a failed reduce raises at once, not after every other one
            done, pending = ray.wait(pending, num_returns=1)
            reduced[partition[done[0]]] = ray.get(done[0])
        return smalls, reduced
    finally:  # a task failed or the driver stopped: none of the pass may still run when the caller goes on
        cancel_and_wait(pending)

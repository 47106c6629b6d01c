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
    yielded in item order, so a driver merging them sees the order a single process would."""
    import ray

    parallel = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    remote = ray.remote(_call)
    pending: list[Any] = []
    for item in items:
        pending.append(remote.remote(fn, item))
        if len(pending) > parallel:
            yield ray.get(pending.pop(0))
    for ref in pending:
        yield ray.get(ref)

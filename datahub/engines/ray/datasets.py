"""Ray Datasets built for callers above the engines (the loader's ``ray_dataset``), so only
``datahub/engines/`` imports ray. Ray is imported on call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

from datahub.errors import MissingDependencyError


def map_items(items: Sequence[Mapping[str, Any]], fn: Callable[..., Any], *, fn_kwargs: Mapping[str, Any],
              batch_format: Literal["numpy", "pyarrow"] = "numpy") -> Any:
    """A lazy Ray Dataset: one block per item, each mapped by ``fn(batch, **fn_kwargs)`` (one item per batch)."""
    try:
        import ray.data
    except ImportError:
        raise MissingDependencyError("a Ray Dataset needs Ray Data: pip install 'datahub[ray]'") from None
    dataset = ray.data.from_items(list(items), override_num_blocks=max(1, len(items)))
    # fn takes keyword arguments besides the batch, which Ray's annotation of map_batches does not express
    return dataset.map_batches(cast(Any, fn), fn_kwargs=dict(fn_kwargs), batch_size=1, batch_format=batch_format)

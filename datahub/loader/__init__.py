"""The trainer-side reader of exported releases.

``ReleaseDataset`` (a ``torch.utils.data.IterableDataset`` when torch is installed), ``PackedDataset``
(fixed-length token sequences packed from a token export), ``MixtureDataset`` (a weighted read-time mixture of
either) and ``ray_dataset`` (a Ray Dataset for Ray Train). All are resolved on first access so that
``import datahub.loader`` imports neither torch nor ray. ``ReadPolicy`` sets the timeouts and retry bounds of
remote reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from datahub.loader.read_policy import ReadPolicy

if TYPE_CHECKING:
    from datahub.loader.dataset import ReleaseDataset
    from datahub.loader.mixture import MixtureDataset
    from datahub.loader.packing import PackedDataset
    from datahub.loader.ray_data import ray_dataset

__all__ = ["MixtureDataset", "PackedDataset", "ReadPolicy", "ReleaseDataset", "ray_dataset"]


def __getattr__(name: str) -> Any:
    if name == "ReleaseDataset":
        from datahub.loader.dataset import ReleaseDataset

        return ReleaseDataset
    if name == "PackedDataset":
        from datahub.loader.packing import PackedDataset

        return PackedDataset
    if name == "MixtureDataset":
        from datahub.loader.mixture import MixtureDataset

        return MixtureDataset
    if name == "ray_dataset":
        from datahub.loader.ray_data import ray_dataset

        return ray_dataset
    raise AttributeError(f"module 'datahub.loader' has no attribute {name!r}")

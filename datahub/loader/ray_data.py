"""``ray_dataset``: a release as a Ray Dataset (one block per shard), for Ray Train's ``datasets=``.

Ray Train splits the dataset over its workers itself (``streaming_split``); shards are read with
the same tier failover, cache and checksum as ReleaseDataset. Ray is imported on call.
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Mapping, Sequence
from typing import Any

from datahub.engines.ray.datasets import map_items
from datahub.errors import IntegrityError
from datahub.loader.manifest import load_manifest
from datahub.shards.manifest import Manifest
from datahub.loader.read_policy import ReadPolicy
from datahub.loader.shard_source import ShardSource, Verify
from datahub.loader.storage_options import StorageArg, as_storage, manifest_options, readable_tiers, tier_list, tier_options
from datahub.shards.index import index_tar

_utf8 = codecs.utf_8_decode


def _read_shards(batch: dict[str, Any], source: ShardSource) -> Any:
    import pyarrow as pa

    sample_ids: list[str] = []
    texts: list[str] = []
    metas: list[str | None] = []
    shard_names: list[str] = []
    for shard_index in batch["shard_index"]:
        data = source.read_buffer(int(shard_index))
        name = source.manifest.shards[int(shard_index)].name
        index = index_tar(data, where=name)
        view = memoryview(data)
        text_starts, text_stops = index.bounds("txt")
        meta_starts, meta_stops = index.bounds("json")
        for i, key in enumerate(index.keys):
            if text_starts[i] < 0:
                raise IntegrityError(f"shard {name}: sample {key} has no .txt member")
            sample_ids.append(key)
            texts.append(_utf8(view[text_starts[i] : text_stops[i]], None, True)[0])
            metas.append(_utf8(view[meta_starts[i] : meta_stops[i]], None, True)[0] if meta_starts[i] >= 0 else None)
        shard_names.extend([name] * len(index.keys))
    return pa.table({"sample_id": sample_ids, "text": texts, "meta": metas, "shard": shard_names})


def ray_dataset(
    release_or_manifest: str | Mapping[str, Any] | Manifest,
    *,
    lake: str | os.PathLike[str] | None = None,
    storage: StorageArg = None,
    tier_preference: Sequence[str] | None = None,
    verify: Verify = True,
    shuffle_seed: int | None = None,
    read_policy: ReadPolicy | None = None,
) -> Any:
    """Columns: sample_id, text, meta (the sample's JSON metadata as a string), shard.

    ``storage``, ``verify`` and ``read_policy`` are as for ReleaseDataset (``storage``: ``{tier: fsspec options}``
    or the export's StorageConfig / YAML path).
    ``shuffle_seed`` permutes the shard order (use ``ds.random_shuffle`` or Ray Train's
    local shuffle buffer for sample-level mixing).
    """
    storage_config = as_storage(storage)
    options = manifest_options(storage_config, release_or_manifest) if isinstance(release_or_manifest, str) else None
    manifest = load_manifest(release_or_manifest, lake=lake, storage_options=options, read_policy=read_policy)
    tier_preference = tier_list(tier_preference)  # "cfs" alone is ["cfs"]
    source = ShardSource(manifest, tier_preference=tier_preference, verify=verify, read_policy=read_policy,
                         storage=tier_options(storage_config, tiers=readable_tiers(manifest, tier_preference)))
    shard_indexes = list(range(len(manifest.shards)))
    if shuffle_seed is not None:
        import numpy as np

        shard_indexes = np.random.default_rng(shuffle_seed).permutation(len(shard_indexes)).tolist()
    items = [{"shard_index": i} for i in shard_indexes]
    return map_items(items, _read_shards, fn_kwargs={"source": source})

"""Load an export manifest (the contract in schemas/, model in ``datahub.shards.manifest``) from a dict, path,
URI or release name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from datahub.errors import IntegrityError
from datahub.loader.errors import ManifestError
from datahub.shards.manifest import Manifest


def load_manifest(
    release_or_manifest: str | Mapping[str, Any] | Manifest,
    *,
    lake: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Accept a parsed manifest, a dict, a path/URI to ``manifest.json`` (or its export dir), or a release name.

    A release name (no ``/``, not ending in ``.json``) is resolved, for now, as
    ``{lake}/_exports/{release}/manifest.json``; resolving through the lake's ``releases``
    table is the release module's job and will replace this convention.
    """
    if isinstance(release_or_manifest, Manifest):
        return release_or_manifest
    if isinstance(release_or_manifest, Mapping):
        return _parse(dict(release_or_manifest), where="manifest dict")
    ref = str(release_or_manifest)
    if "/" not in ref and not ref.endswith(".json"):
        if lake is None:
            raise ManifestError(
                f"release name {ref!r} given without lake=; pass lake='/path/to/lake' or a manifest path"
            )
        ref = f"{lake.rstrip('/')}/_exports/{ref}/manifest.json"
    elif not ref.endswith(".json"):
        ref = ref.rstrip("/") + "/manifest.json"
    import fsspec

    try:
        with fsspec.open(ref, "rb", **dict(storage_options or {})) as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {ref}; was the release exported?") from None
    except (OSError, ValueError) as error:
        raise ManifestError(f"cannot read manifest {ref}: {error}") from error
    return _parse(data, where=ref)


def _parse(data: dict[str, Any], *, where: str) -> Manifest:
    try:
        return Manifest.from_dict(data, where=where, strict=False)
    except IntegrityError as error:
        raise ManifestError(str(error)) from None

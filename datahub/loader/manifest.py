"""Load an export manifest (the contract in schemas/, model in ``datahub.shards.manifest``) from a dict, path,
URI or release name."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Mapping
from typing import Any

from datahub.config.lake_file import is_lake_file, load_lake_spec
from datahub.errors import IntegrityError
from datahub.lake.lake import fsspec_options
from datahub.loader.errors import ManifestError, ManifestUnavailableError, ReplicaUnavailableError, replica_error
from datahub.loader.read_policy import DEFAULT_READ_POLICY, ReadPolicy, limit_transport_retries
from datahub.retry import retry
from datahub.shards.manifest import Manifest


def load_manifest(
    release_or_manifest: str | Mapping[str, Any] | Manifest,
    *,
    lake: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    read_policy: ReadPolicy | None = None,
) -> Manifest:
    """Accept a parsed manifest, a dict, a path/URI to ``manifest.json`` (or its export dir), or a release name.

    A remote manifest is read with ``read_policy``'s timeouts and retried ``attempts`` times when the store does
    not answer (then ``ManifestUnavailableError``); a missing or unreadable one raises ``ManifestError`` at once.

    A release name (no ``/``, not ending in ``.json``) is resolved, for now, as
    ``{lake}/_exports/{release}/manifest.json``; ``lake`` is a root or a lake YAML (``root:`` and
    ``storage_options:``, as ``--lake`` takes), whose options read the manifest; resolving through the lake's ``releases``
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
        root, lake_options = _lake_root(lake)
        release, ref = ref, f"{root.rstrip('/')}/_exports/{ref}/manifest.json"
        storage_options = {**lake_options, **(storage_options or {})}
        if "://" not in root and not os.path.isfile(ref):  # a local lake: say what it holds, not only what it lacks
            raise ManifestError(_not_exported(root, release, ref))
    elif not ref.endswith(".json"):
        ref = ref.rstrip("/") + "/manifest.json"
    policy = read_policy or DEFAULT_READ_POLICY
    raw = retry(lambda: _read(ref, policy.fsspec_options(ref, storage_options or {})), attempts=policy.attempts,
                backoff=policy.backoff_s, max_backoff=policy.max_backoff_s, jitter=policy.jitter)
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ManifestError(f"cannot read manifest {ref}: not JSON ({error})") from error
    return _parse(data, where=ref)


def _not_exported(root: str, release: str, ref: str) -> str:
    """Why a local lake has no manifest of ``release``: no such directory, or the releases it did export."""
    if not os.path.isdir(root):
        return f"no lake at {root} (the directory does not exist); pass lake= the lake root `datahub export` wrote to"
    exports = os.path.join(root, "_exports")
    try:
        names = sorted(name for name in os.listdir(exports)
                       if os.path.isfile(os.path.join(exports, name, "manifest.json")))
    except OSError:
        names = []
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return (f"no manifest at {ref}; was the release exported? "
            + (f"releases exported to this lake: {listed}" if names else "this lake has no exported release")
            + f" (`datahub export {release} --lake {root} --tier TIER --storage storage.yaml` exports it)")


def _lake_root(lake: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """The root of ``lake`` (a root, or a lake YAML as every command's ``--lake`` takes) and the filesystem options
    its ``storage_options`` give (endpoint and keys of an S3 lake)."""
    ref = os.fspath(lake)  # a str or a pathlib.Path
    if not is_lake_file(ref):
        return ref, {}
    spec = load_lake_spec(ref)
    return spec.root, fsspec_options(spec.storage_options)


def _read(ref: str, options: Mapping[str, Any]) -> bytes:
    import fsspec.core

    try:
        fs, path = fsspec.core.url_to_fs(ref, **options)
        limit_transport_retries(fs)
        data = bytes(fs.cat_file(path))
        cyclic = _freed_by_the_collector_only(fs)
        del fs
        if cyclic:
            gc.collect()
        return data
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {ref}; was the release exported?") from None
    except Exception as error:  # classified like a shard replica read; anything else is a bug and propagates
        classified = replica_error(error)
        if classified is None:
            raise
        if isinstance(classified, ReplicaUnavailableError):
            raise ManifestUnavailableError(f"cannot read manifest {ref}: storage did not answer ({classified}); "
                                           "check that it is up and reachable") from error
        raise ManifestError(f"cannot read manifest {ref}: {classified}") from error


def _freed_by_the_collector_only(fs: Any) -> bool:
    """An async fsspec filesystem (s3fs): its sync methods are closures over it, so only the cyclic collector frees
    it, whenever it next runs. After a trainer read its manifest that was in forked DataLoader workers, where s3fs's
    session finalizer closed the trainer's aiohttp client on the worker's own event loop ('Task exception was never
    retrieved ... attached to a different loop', twice per worker) after a 0.1 s wait; ``_read`` collects it at once,
    in the process that made it (one collection per manifest read from such a store, ~70 ms with torch imported)."""
    from fsspec.asyn import AsyncFileSystem

    return isinstance(fs, AsyncFileSystem)


def _parse(data: dict[str, Any], *, where: str) -> Manifest:
    if isinstance(data, dict) and "files" in data and "shards" not in data:  # what `export --tokenizer` writes
        raise ManifestError(f"{where}: the manifest of a token export (Megatron .bin/.idx files, read by "
                            "PackedDataset), not of WebDataset shards; read it with PackedDataset(path, seq_len=N), "
                            "or give the release's manifest.json (RELEASE/manifest.json on the tier, or "
                            "LAKE/_exports/RELEASE/manifest.json)")
    withdrawn = data.get("withdrawn") if isinstance(data, dict) else None
    if withdrawn:  # `datahub tier remove` took it down (DMCA, PII): its shards are gone from every tier
        mark = withdrawn if isinstance(withdrawn, dict) else {}
        raise ManifestError(f"{where}: release {data.get('release')!r} was withdrawn at {mark.get('at', '?')}: "
                            f"{mark.get('reason', 'no reason recorded')}; its shards were removed from every tier "
                            "(`datahub tier remove`); train on the release that replaced it")
    try:
        return Manifest.from_dict(data, where=where, strict=False)
    except IntegrityError as error:
        raise ManifestError(str(error)) from None

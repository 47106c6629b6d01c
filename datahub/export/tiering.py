"""Move exported releases between tiers by policy: plan (dry run) and apply.

apply, per release and target tier: copy each shard from a verified replica -> verify size
and sha256 at the destination -> publish the manifest with the new replica (tiers, then lake)
-> only then delete replicas the policy no longer wants (manifest first, bytes after).
Every step checks what is already there, so an interrupted apply resumes and a second apply
is a no-op. A tier from a second storage config (another region) is just one more tier name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from datahub.errors import IntegrityError, LakeError, SpecError, StorageError
from datahub.export.export import _commit_lineage, _Done, publish_manifest
from datahub.export.manifest import MANIFEST_NAME, Manifest, read_lake_manifest
from datahub.storage.config import StorageConfig
from datahub.storage.policy import ReleaseState, desired_tiers, storage_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Move:
    release: str
    action: Literal["copy", "delete"]
    tier: str
    source: str | None  # tier copied from (copy only)
    shards: int
    bytes: int
    storage_class: str | None = None
    leftover: bool = False  # a delete of files the manifest already dropped (an interrupted apply)


@dataclass(frozen=True)
class TierPlan:
    moves: tuple[Move, ...]

    @property
    def bytes_to_copy(self) -> int:
        return sum(m.bytes for m in self.moves if m.action == "copy")

    @property
    def bytes_to_delete(self) -> int:
        return sum(m.bytes for m in self.moves if m.action == "delete")

    def as_dict(self) -> dict[str, Any]:
        return {"moves": [asdict(m) for m in self.moves], "bytes_to_copy": self.bytes_to_copy,
                "bytes_to_delete": self.bytes_to_delete}


def exported_releases(lake: Any) -> list[str]:
    """Release names with a manifest under ``{lake}/_exports/``."""
    import fsspec

    from datahub.lake.lake import fsspec_options

    fs, path = fsspec.core.url_to_fs(f"{lake.root}/_exports", **fsspec_options(lake.storage_options))
    try:
        entries = fs.ls(path, detail=False, refresh=True) if "s3" in str(fs.protocol) else fs.ls(path, detail=False)
    except FileNotFoundError:
        return []
    names = sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)
    return [n for n in names if fs.exists(f"{path}/{n}/{MANIFEST_NAME}")]


def release_states(lake: Any, names: list[str], *, manifests: Mapping[str, Manifest] | None = None
                   ) -> dict[str, ReleaseState]:
    """The policy's inputs per release: channels (``release_channels``), archived flag and last read
    (``release_events``), and when it was released. An export of a bare table version (no release
    record) has only its manifest's ``created``."""
    from datahub.release.events import ReleaseActivity, release_activity
    from datahub.release.records import list_releases

    releases = {r.name: r for r in list_releases(lake)}
    activity = release_activity(lake)
    states = {}
    for name in names:
        release = releases.get(name)
        seen = activity.get(name, ReleaseActivity())
        manifest = (manifests or {}).get(name)
        created = release.created if release is not None else (_parse_time(manifest.created) if manifest else None)
        states[name] = ReleaseState(name, channels=release.channels if release is not None else (),
                                    last_read=seen.last_read, archived=seen.archived, created=created)
    return states


def _parse_time(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def plan_tiers(
    lake: Any,
    *,
    storage: StorageConfig,
    states: Mapping[str, ReleaseState] | None = None,
    targets: Mapping[str, list[str]] | None = None,
    releases: list[str] | None = None,
    now: datetime | None = None,
) -> TierPlan:
    """What ``apply_tiers`` would do. ``targets`` (release -> tiers) overrides the policy for those releases."""
    names = releases if releases is not None else exported_releases(lake)
    targets = dict(targets or {})
    manifests: dict[str, Manifest] = {}
    for name in names:
        manifest = read_lake_manifest(lake, name)
        if manifest is None:
            raise SpecError(f"release {name!r}: no export manifest in {lake.root}/_exports; run `datahub export` first")
        manifests[name] = manifest
    if states is None:
        states = release_states(lake, [n for n in names if n not in targets], manifests=manifests)
    moves: list[Move] = []
    for name in names:
        manifest = manifests[name]
        state = states.get(name, ReleaseState(name))
        klass = None if name in targets else storage_class(state, storage.policy, now=now)
        wanted = targets.get(name) if name in targets else desired_tiers(state, storage.policy, now=now)
        if not wanted:
            continue
        unknown = [t for t in wanted if t not in storage.tiers]
        if unknown:
            raise SpecError(f"release {name!r}: target tiers {unknown} are not configured; configured: {sorted(storage.tiers)}")
        total = sum(s.size for s in manifest.shards)
        held = manifest.tiers
        sources = [t for t in held if t in storage.tiers]
        for tier in wanted:
            if tier not in held:
                if not sources:
                    raise SpecError(f"release {name!r}: no configured tier holds it (replicas on {held}); "
                                    "pass the storage config of the region that has it (--storage twice)")
                moves.append(Move(name, "copy", tier, sources[0], len(manifest.shards), total, klass))
        for tier in held:
            if tier not in wanted and tier in storage.tiers:
                moves.append(Move(name, "delete", tier, None, len(manifest.shards), total, klass))
        for tier in sorted(storage.tiers):
            if tier not in held and tier not in wanted and storage.tier(tier).exists(storage.tier(tier).uri(name)):
                moves.append(Move(name, "delete", tier, None, 0, 0, klass, leftover=True))
    return TierPlan(tuple(moves))


def apply_tiers(lake: Any, plan: TierPlan, *, storage: StorageConfig,
                progress: Callable[..., None] | None = None) -> list[Move]:
    """Carry out a plan (copies of a release before its deletes); returns the moves done."""
    report = progress or (lambda stage, done, total=None: None)
    done: list[Move] = []
    ordered = sorted(plan.moves, key=lambda m: (m.release, m.action != "copy"))
    for step, move in enumerate(ordered):
        manifest = read_lake_manifest(lake, move.release)
        if manifest is None:
            raise SpecError(f"release {move.release!r}: its manifest vanished from {lake.root}/_exports; re-run `datahub export`")
        if move.action == "copy":
            _copy(lake, manifest, move.tier, storage=storage)
        else:
            _delete(lake, manifest, move.tier, storage=storage)
        done.append(move)
        report("moves", step + 1, len(ordered))
    return done


def _copy(lake: Any, manifest: Manifest, tier_name: str, *, storage: StorageConfig) -> None:
    dest = storage.tier(tier_name)
    replicas: dict[str, dict[str, str]] = {}
    for shard in manifest.shards:
        uri = dest.uri(manifest.release, shard.name)
        if not dest.verify(uri, size=shard.size, sha256=shard.sha256):  # resume: verified copies are kept
            dest.publish_verified(uri, _read_verified(manifest, shard, storage), sha256=shard.sha256)
        replicas[shard.name] = {**shard.replicas, tier_name: uri}
    updated = manifest.with_replicas(replicas)
    if not lake.applied("lineage", f"export/{manifest.release}/{tier_name}"):
        _commit_lineage(
            lake, manifest.release, dest,
            [_Done(i, s.name, s.size, s.sha256, s.samples, start, start + s.samples)
             for i, (s, start) in enumerate(_starts(manifest))],
            _ids(lake, manifest, storage), manifest.export.get("key", ""))
    publish_manifest(lake, updated, storage=storage, extra_tiers=[dest])


def _delete(lake: Any, manifest: Manifest, tier_name: str, *, storage: StorageConfig) -> None:
    tier = storage.tier(tier_name)
    if tier_name in {t for s in manifest.shards for t in s.replicas}:
        remaining = {s.name: {t: u for t, u in s.replicas.items() if t != tier_name} for s in manifest.shards}
        if any(not r for r in remaining.values()):
            raise IntegrityError(f"release {manifest.release!r}: deleting tier {tier_name} would leave a shard with "
                                 "no replica; copy it to another tier first")
        publish_manifest(lake, manifest.with_replicas(remaining), storage=storage)  # readers move off first
    tier.delete(tier.uri(manifest.release), recursive=True)


def _read_verified(manifest: Manifest, shard: Any, storage: StorageConfig) -> bytes:
    import hashlib

    problems = []
    for name, uri in shard.replicas.items():
        if name not in storage.tiers:
            continue
        try:
            data = storage.tier(name).read(uri)
        except (FileNotFoundError, StorageError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if len(data) == shard.size and hashlib.sha256(data).hexdigest() == shard.sha256:
            return data
        problems.append(f"{name}: {uri} does not match the manifest's size/sha256")
    raise IntegrityError(f"release {manifest.release!r}: no intact replica of {shard.name} to copy from "
                         f"({'; '.join(problems) or 'no configured tier holds one'}); re-export the release")


def _starts(manifest: Manifest) -> list[tuple[Any, int]]:
    out, start = [], 0
    for shard in manifest.shards:
        out.append((shard, start))
        start += shard.samples
    return out


def _ids(lake: Any, manifest: Manifest, storage: StorageConfig) -> Any:
    """Sample keys in shard order (the lineage index of the new tier).

    Recomputed from the lake, not from shard bytes: the export order is a function of the frozen
    table version's sample ids and the shuffle seed (``prepare``), so one column is read instead
    of every shard again. Falls back to indexing the shards when that version is gone (vacuumed).
    """
    import pyarrow as pa

    from datahub.export.samples import KEY_COLUMN, prepare
    from datahub.loader.tar_index import index_tar

    where = f"{lake.root}/{manifest.table}@v{manifest.table_version}"
    try:
        names = set(pa.schema(lake.table(manifest.table, manifest.table_version).schema().to_arrow()).names)
        columns = [KEY_COLUMN] + (["_drop_reason"] if "_drop_reason" in names else [])
        rows = prepare(lake.read(manifest.table, version=manifest.table_version, columns=columns),
                       shuffle_seed=manifest.shuffle_seed, where=where)
        if rows.num_rows == manifest.num_samples:
            return rows[KEY_COLUMN]
        log.warning("%s holds %d samples, the manifest of %s %d: indexing the shards instead", where, rows.num_rows,
                    manifest.release, manifest.num_samples)
    except LakeError as exc:  # the version was vacuumed or the table is gone: the shards are the truth
        log.warning("%s: %s; indexing the shards instead", where, exc)
    keys: list[str] = []
    for shard in manifest.shards:
        keys.extend(index_tar(_read_verified(manifest, shard, storage), where=shard.name).keys)
    return pa.chunked_array([pa.array(keys, pa.string())])

"""Move exported releases between tiers by policy: plan (dry run) and apply.

apply, per release and target tier: stream each shard from a replica that matches the manifest (8 MiB at a
time, ``workers`` shards at once, under an optional bandwidth cap) -> verify size and sha256 at the destination
-> record the new tier's lineage index (from each copy's ``__index__`` member) -> publish the manifest with the
new replica (tiers, then lake) -> only then delete replicas the policy no longer wants (manifest first, bytes
after). Memory holds a few chunks and one shard's keys, whatever the release or shard size.
Every step checks what is already there, so an interrupted apply resumes and a second apply
is a no-op; a finished copy or repair then removes what a killed one left in the release's directory (temp files,
incomplete Ceph multipart uploads) once abandoned (cfs: unlocked; hdfs, ceph: unwritten for ``STALE_PARTIAL_S``, an
hour), so the uploads of an apply or export running at the same time (overlapping cron runs; nothing locks a
release) survive it. A tier from a second storage config (another region) is just one more tier name.
Token files (``{release}/tokens-SHA12/``, written by ``datahub export --tokenizer``) follow the release: a copy to
a tier (or a tier the release is on that lacks them) copies them too, with the same guarantees, and a delete from a
tier the text moves off removes them too, only once each has another replica verified by sha256 on a configured
tier, the token manifests dropping the tier first, then the text manifest, the bytes last
(``datahub.export.token_copies``). A token-only replica (token manifests name the tier, the text manifest does not:
token files exported there on purpose, e.g. to a cfs tier that ``PackedDataset`` memory-maps) is kept by the policy
(cron); a plan with ``drop_token_only`` (``tier apply --tiers``: the user states the release's whole placement)
removes one on a tier it leaves out, the same verified way, after the copy to the placement. A delete never leaves
that state behind, since it drops the token manifests before the text manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from datetime import datetime, timezone
from typing import Any, Literal

import pyarrow as pa

from datahub.close_names import did_you_mean
from datahub.engines.sink import Sink
from datahub.errors import IntegrityError, SpecError, StorageError
from datahub.export.export import EXPORT_OP, WITHDRAWN_KEY, publish_manifest, read_withdrawal
from datahub.export.exported_lineage import commit_shard_index
from datahub.export.token_copies import (HashedParts, check_other_replicas, copy_token_files, drop_token_replicas,
                                         token_copies, token_replicas_on)
from datahub.shards.manifest import MANIFEST_NAME, Manifest, ShardRecord, lake_manifest_uri, read_lake_manifest
from datahub.shards.token_manifest import TokenManifest, read_lake_token_manifests, token_dir
from datahub.lake.lake import Lake, fsspec_options
from datahub.pipeline.faults import checkpoint
from datahub.release.events import ReleaseActivity, release_activity
from datahub.release.records import list_releases, release_exists
from datahub.shards.index import embedded_keys, index_tar
from datahub.storage.bandwidth import BandwidthCap
from datahub.storage.config import StorageConfig
from datahub.storage.policy import ReleaseState, desired_tiers, storage_class
from datahub.storage.tier import STALE_PARTIAL_S, Tier, _publish_posix

ShardProgress = Callable[[int, int], None]  # (shards done, shards to copy) of one move

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Move:
    release: str
    action: Literal["copy", "delete", "repair"]
    tier: str
    source: str | None  # tier copied from (copy only)
    shards: int
    bytes: int
    storage_class: str | None = None
    leftover: bool = False  # a delete of files no manifest names (an interrupted apply); a token-only replica stays
    token_only: bool = False  # a delete of a token-only replica (--tiers leaves its tier out): token files only
    verify: bool = False  # repair (and a copy of token files only): replicas were checked by sha256, not only by size
    token_files: int = 0  # copy: token files (.bin/.idx/.ids each) the tier lacks, copied too; delete: removed too
    token_bytes: int = 0


@dataclass(frozen=True)
class KeptTokens:
    """A token-only replica the plan keeps (no ``drop_token_only``): token files on a tier the text is not on."""

    release: str
    tier: str
    token_files: int
    token_bytes: int


@dataclass(frozen=True)
class TierPlan:
    moves: tuple[Move, ...]
    kept: tuple[KeptTokens, ...] = ()  # token-only replicas left where they are (``tier plan`` says so)

    @property
    def bytes_to_copy(self) -> int:
        return sum(m.bytes + m.token_bytes for m in self.moves if m.action in ("copy", "repair"))

    @property
    def bytes_to_delete(self) -> int:
        return sum(m.bytes + m.token_bytes for m in self.moves if m.action == "delete")

    def as_dict(self) -> dict[str, Any]:
        return {"moves": [asdict(m) for m in self.moves], "bytes_to_copy": self.bytes_to_copy,
                "bytes_to_delete": self.bytes_to_delete, "kept_token_only": [asdict(k) for k in self.kept]}


def exported_releases(lake: Lake) -> list[str]:
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


def release_states(lake: Lake, names: list[str], *, manifests: Mapping[str, Manifest] | None = None
                   ) -> dict[str, ReleaseState]:
    """The policy's inputs per release: channels (``release_channels``), archived flag and last read
    (``release_events``), and when it was released. An export of a bare table version (no release
    record) has only its manifest's ``created``."""
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


def _no_manifest(lake: Lake, name: str) -> SpecError:
    """A release with no export yet, or a name that is neither a release nor an export (a typo)."""
    if release_exists(lake, name):
        return SpecError(f"release {name!r}: no export manifest in {lake.root}/_exports; run `datahub export` first")
    exported = exported_releases(lake)
    shown = ", ".join(exported[:20]) + (f", ... ({len(exported)} in all)" if len(exported) > 20 else "")
    return SpecError(f"no release or export {name!r} in lake {lake.root} (exported there: {shown or 'none'})"
                     + did_you_mean(name, exported))


def plan_tiers(
    lake: Lake,
    *,
    storage: StorageConfig,
    states: Mapping[str, ReleaseState] | None = None,
    targets: Mapping[str, list[str]] | None = None,
    releases: list[str] | None = None,
    now: datetime | None = None,
    verify: bool = False,
    max_bytes_per_s: float | None = None,
    drop_token_only: bool = False,
) -> TierPlan:
    """What ``apply_tiers`` would do. ``targets`` (release -> tiers) overrides the policy for those releases.

    A token-only replica (token files on a tier the text manifest does not name) stays, unless ``drop_token_only``
    and the release is in ``targets`` (``tier apply --tiers``: the whole placement stated): then a tier outside its
    targets gets a ``token_only`` delete of its token files, carried out after the copies to the targets.

    Replicas a release keeps are checked (size; sha256 too with ``verify``, reading them under
    ``max_bytes_per_s`` if given): damaged or missing ones become a ``repair`` move (copied again from an intact
    replica on another tier)."""
    cap = BandwidthCap(max_bytes_per_s) if max_bytes_per_s else None
    names = releases if releases is not None else exported_releases(lake)
    targets = dict(targets or {})
    manifests: dict[str, Manifest] = {}
    for name in list(names):
        manifest = read_lake_manifest(lake, name)
        if manifest is None:
            raise _no_manifest(lake, name)
        withdrawn = read_withdrawal(lake, name)
        if withdrawn is not None:  # taken down (`tier remove`): never copied or repaired again
            if name in targets:
                raise SpecError(f"release {name!r} was withdrawn at {withdrawn.get('at')} ({withdrawn.get('reason')}); "
                                "it is not placed on tiers again")
            names = [n for n in names if n != name]
            continue
        manifests[name] = manifest
    if states is None:
        states = release_states(lake, [n for n in names if n not in targets], manifests=manifests)
    moves: list[Move] = []
    kept: list[KeptTokens] = []
    for name in names:
        manifest = manifests[name]
        token_manifests = read_lake_token_manifests(lake, name)
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
            lacking = (token_copies(lake, name, tier, storage, verify=verify, cap=cap, manifests=token_manifests)
                       if tier in storage.tiers else None)
            token_files, token_bytes = (lacking.files, lacking.bytes) if lacking is not None else (0, 0)
            if tier not in held:
                if not sources:
                    raise SpecError(f"release {name!r}: no configured tier holds it (replicas on {held}); "
                                    "pass the storage config of the region that has it (--storage twice)")
                moves.append(Move(name, "copy", tier, sources[0], len(manifest.shards), total, klass,
                                  token_files=token_files, token_bytes=token_bytes))
            elif tier in storage.tiers:
                damaged = set(damaged_replicas(manifest, storage.tier(tier), verify=verify, cap=cap))
                if damaged:
                    others = [t for t in sources if t != tier]
                    moves.append(Move(name, "repair", tier, others[0] if others else None, len(damaged),
                                      sum(s.size for s in manifest.shards if s.name in damaged), klass, verify=verify))
                if lacking is not None and lacking.files:  # the text is there; token files exported since, or damaged
                    moves.append(Move(name, "copy", tier, lacking.sources(storage)[0], 0, 0, klass, verify=verify,
                                      token_files=token_files, token_bytes=token_bytes))
        for tier in held:
            if tier not in wanted and tier in storage.tiers:
                named = token_replicas_on(tier, token_manifests)
                moves.append(Move(name, "delete", tier, None, len(manifest.shards), total, klass,
                                  token_files=named.files, token_bytes=named.bytes))
        for tier in sorted(storage.tiers):
            if tier in held or tier in wanted:
                continue
            # the text manifest does not name the tier: token folders a token manifest names there are a token-only
            # replica, put there on purpose (a killed delete never leaves one: it drops token manifests first); kept,
            # unless the user stated the release's whole placement
            token_only = token_replicas_on(tier, token_manifests)
            if token_only.files and drop_token_only and name in targets:
                moves.append(Move(name, "delete", tier, None, 0, 0, klass, token_only=True,
                                  token_files=token_only.files, token_bytes=token_only.bytes))
                continue
            if token_only.files:
                kept.append(KeptTokens(name, tier, token_only.files, token_only.bytes))
            if _leftovers(storage.tier(tier), name, token_folders_on(tier, token_manifests)):
                moves.append(Move(name, "delete", tier, None, 0, 0, klass, leftover=True))
    return TierPlan(tuple(moves), tuple(kept))


def token_folders_on(tier: str, manifests: Iterable[TokenManifest]) -> set[str]:
    """The token folders (``tokens-SHA12``) whose token manifest names a replica on ``tier``."""
    return {token_dir(manifest.tokenizer.sha256) for manifest in manifests
            if any(tier in record.replicas for record in manifest.files)}


def _leftovers(tier: Tier, release: str, keep: set[str]) -> list[str]:
    """The entries of the release's directory on ``tier`` but the token folders in ``keep``."""
    return [entry for entry in tier.children(tier.uri(release)) if entry not in keep]


def apply_tiers(lake: Lake, plan: TierPlan, *, storage: StorageConfig,
                progress: Callable[..., None] | None = None, workers: int = 2,
                max_bytes_per_s: float | None = None) -> list[Move]:
    """Carry out a plan (copies and repairs of a release before its deletes); returns the moves done.
    ``workers`` shards are copied at once, each streamed 8 MiB at a time (memory: ``workers`` chunks, whatever
    the shard size); ``max_bytes_per_s`` caps every byte the apply reads, all workers together: from source
    replicas, and at the destination (the read-back verify of each copy, the check of a replica already there,
    the sha256 checks of a repair with ``verify``, the shards' ``__index__`` tails)."""
    report = progress or (lambda stage, done, total=None: None)
    cap = BandwidthCap(max_bytes_per_s) if max_bytes_per_s else None
    done: list[Move] = []
    hashed: HashedParts = set()  # token parts this apply verified by sha256: its deletes check their size only
    ordered = sorted(plan.moves, key=lambda m: (m.release, m.action == "delete"))
    for step, move in enumerate(ordered):
        manifest = read_lake_manifest(lake, move.release)
        if manifest is None:
            raise SpecError(f"release {move.release!r}: its manifest vanished from {lake.root}/_exports; re-run `datahub export`")
        # a copy of a whole release is one move: a count per shard keeps a long one from being silent
        stage = f"{move.release} {move.action} -> {move.tier}: shards"
        shard_done = partial(report, stage)
        if move.action == "copy":
            _copy(lake, manifest, move.tier, storage=storage, workers=workers, cap=cap, verify=move.verify,
                  hashed=hashed, progress=shard_done)
        elif move.action == "repair":
            _repair(manifest, move.tier, storage=storage, verify=move.verify, workers=workers, cap=cap,
                    progress=shard_done)
        elif not _delete(lake, manifest, move.tier, storage=storage, cap=cap, hashed=hashed,
                         token_only=move.token_only):
            continue
        done.append(move)
        report("moves", step + 1, len(ordered))
    return done


def damaged_replicas(manifest: Manifest, tier: Tier, *, verify: bool, cap: BandwidthCap | None = None) -> list[str]:
    """Shards whose replica on ``tier`` is missing or has the wrong size (and, with ``verify``, sha256: read
    under ``cap`` if given)."""
    bad = []
    for shard in manifest.shards:
        uri = tier.uri(manifest.release, shard.name)
        if tier.size(uri) != shard.size or (verify and not tier.verify(uri, size=shard.size, sha256=shard.checksum,
                                                                       cap=cap)):
            bad.append(shard.name)
    return bad


def _repair(manifest: Manifest, tier_name: str, *, storage: StorageConfig, verify: bool, workers: int,
            cap: BandwidthCap | None = None, progress: ShardProgress | None = None) -> list[str]:
    """Copy intact replicas from other tiers over the damaged replicas on ``tier_name``."""
    dest = storage.tier(tier_name)
    damaged = set(damaged_replicas(manifest, dest, verify=verify, cap=cap))
    if damaged:
        log.warning("tier %s: %d damaged or missing shard(s) of %s, copying them again: %s", tier_name, len(damaged),
                    manifest.release, ", ".join(sorted(damaged)))
    shards = [s for s in manifest.shards if s.name in damaged]
    _copy_shards(manifest, shards, dest, storage=storage, skip_tier=tier_name, workers=workers, check_existing=False,
                 cap=cap, progress=progress)
    # what a killed earlier repair left (temp files, open uploads); not a concurrent writer's (see _copy)
    dest.sweep_partials(dest.uri(manifest.release), older_than=STALE_PARTIAL_S)
    return sorted(damaged)


@dataclass(frozen=True)
class ShardCopySink(Sink[list[int], list[int]]):
    """Tier copies on the write seam: each task streams the shards named in its rows (``index`` into the
    manifest's shards) from a replica that matches the manifest to ``dest``, verified there (size and sha256);
    a replica already verified on ``dest`` is kept (resume). The commit returns the indices written; the caller
    publishes the manifest, the one step that makes the copies visible. Holds configuration only."""

    manifest: Manifest
    dest: Tier
    storage: StorageConfig
    skip_tier: str | None
    check_existing: bool
    cap: BandwidthCap | None = None  # shared by every task of the copy

    def write(self, batches: Iterable[pa.Table]) -> list[int]:
        written = []
        for batch in batches:
            for index in batch.column("index").to_pylist():
                shard = self.manifest.shards[index]
                uri = self.dest.uri(self.manifest.release, shard.name)
                if self.check_existing and self.dest.verify(uri, size=shard.size, sha256=shard.checksum,
                                                            cap=self.cap):
                    continue
                self._copy(shard, uri)
                written.append(index)
        return written

    def _copy(self, shard: ShardRecord, uri: str) -> None:
        """Stream the shard from the first replica whose bytes match the manifest (size and sha256, checked as they
        pass), 8 MiB at a time; then read it back at ``dest`` and check its sha256 again. Both reads go under the
        cap (the read-back moves the shard's bytes over the destination's link once more)."""
        expected = shard.checksum
        problems = []
        for name, source_uri in shard.replicas.items():
            if name not in self.storage.tiers or name == self.skip_tier:
                continue
            chunks = _SourceChunks(self.storage.tier(name), source_uri)
            try:
                self.dest.publish_stream(uri, self.cap.metered(chunks) if self.cap else chunks, size=shard.size,
                                         sha256=expected)
            except _SourceError as exc:
                problems.append(f"{name}: {exc}")
                continue
            except IntegrityError:  # what the replica gave does not match the manifest: nothing was published
                problems.append(f"{name}: {source_uri} does not match the manifest's size/sha256")
                continue
            if not self.dest.verify(uri, size=shard.size, sha256=expected, cap=self.cap):
                raise IntegrityError(f"tier {self.dest.name}: {uri} does not match what was written (size "
                                     f"{shard.size}, sha256 {expected[:12]}...); check the tier's health and re-run")
            return
        release = self.manifest.release
        raise IntegrityError(f"release {release!r}: no intact replica of {shard.name} to copy from "
                             f"({'; '.join(problems) or 'no configured tier holds one'}); re-export the release: "
                             f"`datahub export {release} --tier {self.dest.name}` (with the options of its first "
                             "export) rewrites missing or damaged shards from the lake")

    def commit(self, results: list[list[int]]) -> list[int]:
        return sorted(index for result in results for index in result)


class _SourceError(Exception):
    """Reading a source replica failed (the copy tries the next replica); the destination is left unchanged."""


@dataclass
class _SourceChunks:
    """A replica's bytes in chunks, its read errors raised as ``_SourceError``."""

    tier: Tier
    uri: str

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self.tier.chunks(self.uri)
        except (OSError, StorageError) as exc:  # the class says why: s3fs's FileNotFoundError is only the path
            raise _SourceError(f"{type(exc).__name__}: {exc}") from exc


def _copy_shards(manifest: Manifest, shards: list[ShardRecord], dest: Tier, *, storage: StorageConfig,
                 skip_tier: str | None, workers: int, check_existing: bool, cap: BandwidthCap | None = None,
                 progress: ShardProgress | None = None) -> list[int]:
    """Copy shard by shard through ``ShardCopySink``, ``workers`` tasks (one shard each) at once on threads
    of this process, all under one ``cap``; returns the indices of the shards written (those already intact on
    ``dest`` are kept). ``progress(done, total)`` is called with 0 first, then as each shard is finished."""
    sink = ShardCopySink(manifest, dest, storage, skip_tier, check_existing, cap)
    index = {s.name: i for i, s in enumerate(manifest.shards)}
    window = max(1, workers)
    results: list[list[int]] = []
    report = progress or (lambda done, total: None)
    sink.start()
    report(0, len(shards))
    try:
        with ThreadPoolExecutor(max_workers=window, thread_name_prefix="datahub-tier-copy") as pool:
            pending: deque[tuple[ShardRecord, Future[list[int]]]] = deque()

            def finish() -> None:
                shard, future = pending.popleft()
                results.append(future.result())
                report(len(results), len(shards))
                checkpoint(f"tier:after_shard:{index[shard.name]}")  # crash tests: verified on the tier, not published

            for shard in shards:  # at most ``workers`` copies in flight; a failure stops new ones (a re-run resumes)
                if len(pending) == window:
                    finish()
                task = [pa.table({"index": pa.array([index[shard.name]], pa.int64())})]
                pending.append((shard, pool.submit(sink.write, task)))
            while pending:
                finish()
        return sink.commit(results)
    except BaseException as exc:
        sink.abort(results, exc)
        raise


def _copy(lake: Lake, manifest: Manifest, tier_name: str, *, storage: StorageConfig, workers: int = 2,
          cap: BandwidthCap | None = None, verify: bool = False, hashed: HashedParts | None = None,
          progress: ShardProgress | None = None) -> None:
    """The release's shards onto ``tier_name`` (unless its manifest names the tier already), then its token files
    (those missing there or damaged: by size, by sha256 too with ``verify``)."""
    dest = storage.tier(tier_name)
    if tier_name not in manifest.tiers:
        _copy_text(lake, manifest, dest, storage=storage, workers=workers, cap=cap, progress=progress)
    copy_token_files(lake, manifest.release, dest, storage=storage, workers=workers, cap=cap, verify=verify,
                     hashed=hashed)


def _copy_text(lake: Lake, manifest: Manifest, dest: Tier, *, storage: StorageConfig, workers: int,
               cap: BandwidthCap | None, progress: ShardProgress | None = None) -> None:
    tier_name = dest.name
    _copy_shards(manifest, list(manifest.shards), dest, storage=storage, skip_tier=None, workers=workers,
                 check_existing=True, cap=cap, progress=progress)
    replicas = {shard.name: {**shard.replicas, tier_name: dest.uri(manifest.release, shard.name)}
                for shard in manifest.shards}
    updated = manifest.with_replicas(replicas)
    _commit_lineage(lake, manifest, dest, storage, cap=cap)
    publish_manifest(lake, updated, storage=storage, extra_tiers=[dest])
    # what a killed earlier apply left there: temp files (cfs, hdfs), incomplete multipart uploads (ceph); not those
    # of a live writer (see Tier.sweep_partials), since an overlapping apply (cron) or export may be writing there
    dest.sweep_partials(dest.uri(manifest.release), older_than=STALE_PARTIAL_S)


def _delete(lake: Lake, manifest: Manifest, tier_name: str, *, storage: StorageConfig,
            cap: BandwidthCap | None = None, hashed: HashedParts | None = None, token_only: bool = False) -> bool:
    """Delete the release's replicas on a tier, its token files included; False when a leftover directory (the
    manifest does not name the tier) is spared because a writer is at work in it: a second-tier export journals there
    before its manifest names the tier, and deleting under it published a manifest of deleted replicas. On a tier the
    text manifest does not name, the token folders a token manifest names (a token-only replica) stay and the rest
    goes, unless ``token_only`` (a planned delete of that replica: ``--tiers`` leaves the tier out): then all goes.

    Every token file there must have another replica verified by sha256 (under ``cap``; by size for the parts in
    ``hashed``, which this apply's copies read back) first; then each token manifest drops the tier, then the text
    manifest (readers move off), and only then the bytes go. A kill before the text manifest leaves a delete move,
    after it a leftover (no manifest names the files), which the next plan finishes; neither is a token-only
    replica. A killed ``token_only`` delete is still that replica (the lake's token manifest names the tier) or,
    once the token manifests dropped the tier, a leftover."""
    tier = storage.tier(tier_name)
    held = tier_name in {t for s in manifest.shards for t in s.replicas}
    token_manifests = read_lake_token_manifests(lake, manifest.release)
    if token_only and held:  # the text was copied there since the plan: a token-only delete never takes text
        log.warning("tier %s: %r holds the text now; its token files there are not a token-only replica, kept (plan "
                    "again)", tier_name, manifest.release)
        return False
    if not held:
        live = tier.live_writes(tier.uri(manifest.release), within=STALE_PARTIAL_S)
        if live:
            log.warning("tier %s: %s/ is not in the manifest of %r but was written to in the last %d s (%s: a "
                        "running export or copy?); left alone, a later apply deletes it once abandoned", tier_name,
                        manifest.release, manifest.release, int(STALE_PARTIAL_S), live[0])
            return False
        keep = set() if token_only else token_folders_on(tier_name, token_manifests)
        if keep:
            for entry in _leftovers(tier, manifest.release, keep):
                tier.delete(tier.uri(manifest.release, entry), recursive=True)
            log.info("tier %s: kept the token files of %r there (%s: a token-only replica)", tier_name,
                     manifest.release, ", ".join(sorted(keep)))
            return True
    tokens = token_replicas_on(tier_name, token_manifests)
    check_other_replicas(tokens, storage, cap=cap, hashed=hashed)  # before any change: a refusal changes nothing
    remaining = {s.name: {t: u for t, u in s.replicas.items() if t != tier_name} for s in manifest.shards}
    if held and any(not r for r in remaining.values()):
        raise IntegrityError(f"release {manifest.release!r}: deleting tier {tier_name} would leave a shard with "
                             "no replica; copy it to another tier first")
    drop_token_replicas(lake, tokens, storage)  # first: the text manifest naming the tier marks the delete unfinished
    checkpoint("tier:delete:after_token_manifests")
    if held:
        publish_manifest(lake, manifest.with_replicas(remaining), storage=storage)  # readers move off first
    checkpoint("tier:delete:after_text_manifest")
    checkpoint("tier:delete:before_files")  # the same point since the token manifests go first; kept for crash tests
    tier.delete(tier.uri(manifest.release), recursive=True)
    if tokens.files:
        log.info("tier %s: removed %d token files of %r %s (each verified on another tier first)", tier_name,
                 tokens.files, manifest.release, "with the release" if held else "(a token-only replica)")
    return True


def _read_verified(manifest: Manifest, shard: ShardRecord, storage: StorageConfig, *,
                   skip_tier: str | None = None, cap: BandwidthCap | None = None) -> bytearray:
    """A whole shard from the first replica matching the manifest, read 8 MiB at a time under ``cap`` (charged per
    chunk as it arrives, as the streamed copies are: not a whole shard at line rate and the wait afterwards)."""
    problems = []
    for name, uri in shard.replicas.items():
        if name not in storage.tiers or name == skip_tier:
            continue
        tier = storage.tier(name)
        digest, data = hashlib.sha256(), bytearray()
        try:
            for chunk in cap.metered(tier.chunks(uri)) if cap is not None else tier.chunks(uri):
                digest.update(chunk)
                data += chunk
                if len(data) > shard.size:
                    break  # not the manifest's bytes: read no further
        except (FileNotFoundError, StorageError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if len(data) == shard.size and digest.hexdigest() == shard.sha256:
            return data
        problems.append(f"{name}: {uri} does not match the manifest's size/sha256")
    raise IntegrityError(f"release {manifest.release!r}: no intact replica of {shard.name} to copy from "
                         f"({'; '.join(problems) or 'no configured tier holds one'}); re-export the release")


def _commit_lineage(lake: Lake, manifest: Manifest, dest: Tier, storage: StorageConfig, *,
                    cap: BandwidthCap | None = None) -> None:
    """The new tier's shard index as ``exported`` lineage events, as ``datahub export`` writes them (txn
    ``export/{release}/{tier}``: a re-run is a no-op), one shard's keys at a time."""
    shards = ((shard.name, _shard_keys(manifest, index, dest, storage, cap=cap))
              for index, shard in enumerate(manifest.shards))
    commit_shard_index(lake, manifest.release, dest, shards, op=EXPORT_OP, params_hash=manifest.export.get("key", ""))


def _shard_keys(manifest: Manifest, index: int, dest: Tier, storage: StorageConfig, *,
                cap: BandwidthCap | None = None) -> pa.Array:
    """Sample keys of shard ``index`` in shard order (the lineage index of a new tier), from its copy on ``dest``.

    Read from the shard's ``__index__`` member (two ranged reads of the archive's tail, about 60 bytes per
    sample): the copy was verified against the manifest's sha256, which covers the index. Memory stays one
    shard's keys whatever the release's size (recomputing the export order from the lake held every id of
    the release and sorted them). A shard without an index is read whole from a verified replica and indexed.
    """
    record = manifest.shards[index]
    uri = dest.uri(manifest.release, record.name)

    def read_range(start: int, end: int) -> bytes:
        data = dest.read_range(uri, start, end)
        if cap is not None:
            cap.take(len(data))
        return data

    keys = embedded_keys(read_range, record.size)
    if keys is None or len(keys) != record.samples:
        keys = index_tar(_read_verified(manifest, record, storage, cap=cap), where=record.name).keys
    return pa.array(keys, pa.string())


@dataclass(frozen=True)
class Removal:
    """What ``remove_release`` did: the withdrawal mark and, per tier, the files and bytes it deleted."""

    release: str
    reason: str
    withdrawn_at: str
    removed: dict[str, dict[str, int]]  # tier -> {"files": n, "bytes": b}; only tiers where something went

    @property
    def files(self) -> int:
        return sum(r["files"] for r in self.removed.values())

    @property
    def bytes(self) -> int:
        return sum(r["bytes"] for r in self.removed.values())

    def as_dict(self) -> dict[str, Any]:
        return {"release": self.release, "reason": self.reason, "withdrawn_at": self.withdrawn_at,
                "files": self.files, "bytes": self.bytes, "removed": self.removed}


def remove_release(lake: Lake, release: str, *, reason: str, storage: StorageConfig,
                   now: datetime | None = None) -> Removal:
    """Take an export down (DMCA, PII): mark its manifests withdrawn (reason, time), the lake's first, then every
    tier copy, so the loader refuses the release from then on whatever happens next; then delete its shards, token
    files and leftovers on every configured tier (a tier's ``manifest.json`` stays, marked, so a trainer pointed at
    the tier is told why). A re-run finishes a killed one and keeps the first mark; once done it deletes nothing."""
    if not reason.strip():
        raise SpecError("--reason is empty; say why the release is taken down (e.g. 'DMCA notice 2026-12-07')")
    uri = lake_manifest_uri(lake, release)
    raw = _raw_json(lake, uri)
    if raw is None:
        raise _no_manifest(lake, release)
    mark = raw.get(WITHDRAWN_KEY) or {"reason": reason, "at": (now or datetime.now(timezone.utc)).isoformat()}
    marked = (json.dumps({**raw, WITHDRAWN_KEY: mark}, indent=1) + "\n").encode()
    if raw.get(WITHDRAWN_KEY) != mark:
        _publish_lake_json(lake, uri, marked)
    checkpoint("tier:remove:after_lake_mark")
    for token_uri in _lake_token_manifest_uris(lake, release):  # what PackedDataset opens: marked the same way
        token_raw = _raw_json(lake, token_uri)
        if token_raw is not None and token_raw.get(WITHDRAWN_KEY) != mark:
            _publish_lake_json(lake, token_uri, (json.dumps({**token_raw, WITHDRAWN_KEY: mark}, indent=1) + "\n").encode())
    removed: dict[str, dict[str, int]] = {}
    for name in sorted(storage.tiers):
        tier = storage.tier(name)
        manifest_uri = tier.uri(release, MANIFEST_NAME)
        if tier.exists(manifest_uri) and tier.read(manifest_uri) != marked:
            tier.publish(manifest_uri, marked)  # a tier copy of the manifest refuses readers too
        files = bytes_ = 0
        fs = tier.filesystem()
        for entry in tier.children(tier.uri(release)):
            if entry == MANIFEST_NAME:
                continue
            entry_uri = tier.uri(release, entry)
            for size in _file_sizes(fs, tier, entry_uri):
                files += 1
                bytes_ += size
            tier.delete(entry_uri, recursive=True)
            checkpoint("tier:remove:after_entry")
        if files:
            removed[name] = {"files": files, "bytes": bytes_}
            log.info("tier %s: removed %d files, %d bytes of withdrawn release %r", name, files, bytes_, release)
    return Removal(release, str(mark.get("reason", reason)), str(mark.get("at", "")), removed)


def _file_sizes(fs: Any, tier: Tier, uri: str) -> list[int]:
    """Sizes of the files at ``uri`` (one file, or every file under a directory)."""
    path = tier._path(uri)
    found = fs.find(path, detail=True)
    return [int(info.get("size") or 0) for info in found.values() if info.get("type", "file") == "file"]


def _lake_token_manifest_uris(lake: Lake, release: str) -> list[str]:
    """``{lake}/_exports/{release}/tokens-SHA12.json``: the release's token manifests in the lake."""
    import fsspec

    folder = f"{lake.root}/_exports/{release}"
    fs, path = fsspec.core.url_to_fs(folder, **fsspec_options(lake.storage_options))
    try:
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    return [f"{folder}/{name}" for name in sorted(names) if name.startswith("tokens-") and name.endswith(".json")]


def _raw_json(lake: Lake, uri: str) -> dict[str, Any] | None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    try:
        data = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _publish_lake_json(lake: Lake, uri: str, data: bytes) -> None:
    """Replace a lake JSON file atomically (rename on POSIX, one PUT on S3)."""
    import fsspec

    if lake.is_local:
        _publish_posix(Path(uri.removeprefix("file://")), data)
        return
    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    fs.pipe_file(path, data)
    fs.invalidate_cache(path.rsplit("/", 1)[0])

"""Token files follow their release to the tiers ``datahub tier apply`` copies it to, and off the tiers it leaves.

A token export (``datahub export --tokenizer``) writes ``{release}/tokens-SHA12/PREFIX.bin|.idx|.ids`` on one tier
and names it in the token manifest. When tier apply puts the release on a tier (a policy copy, another region),
each token file the manifest does not yet name there is copied part by part, as the text shards are: streamed
8 MiB at a time from a replica whose bytes match the manifest (size and sha256, checked as they pass; the next
replica is tried otherwise), read back and checked again at the destination, ``workers`` parts at once, every byte
under the apply's bandwidth cap. Then the new tier's ``exported`` lineage (from the copied ``.ids``; the same rows
and transaction id a token export to that tier writes), then the manifest with the new replicas (the tiers'
copies, then the lake's: what a reader resolves), then the temp files a killed copy left are swept. A part already
intact on the destination is kept, so an apply killed at any point resumes, and a second apply is a no-op. A
replica the manifest names that lost a part or has one of the wrong size (sha256 too with ``--verify``) is copied
again the same way (a repair).

When tier apply moves the release's text off a tier (its delete move, or the leftover of a killed one), the token
files there go too, as its text shards do: ``check_other_replicas`` first finds, for every file the tier holds,
another replica on a configured tier whose every part matches the manifest by size and sha256 (read under the cap),
and refuses the delete otherwise; then ``drop_token_replicas`` publishes each token manifest without the tier (tiers'
copies, then the lake's), so no reader picks those replicas; then the caller drops the tier from the text manifest and
deletes the bytes with the release's directory. Token manifests go before the text manifest, so a tier that token
manifests name and the text manifest does not is never a half-done delete: it is a token-only replica (token files
exported there on purpose, e.g. to a cfs tier for ``PackedDataset`` beside text on Ceph): a policy run keeps it, and
``tier apply --tiers`` (the release's whole placement) removes it from a tier not listed, through the same two steps.
The loader memory-maps token files from a cfs or local path only: a release moved off every cfs tier must be copied
back to one (``tier apply --tiers ...,CFS``, or a token export to it) before ``PackedDataset`` reads it.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import IntegrityError, StorageError
from datahub.export.exported_lineage import commit_exported
from datahub.export.tokens import TOKENS_OP, publish_token_manifest
from datahub.lake.lake import Lake
from datahub.pipeline.faults import checkpoint
from datahub.shards.indexed import decode_ids
from datahub.shards.token_manifest import (PARTS, FilePart, TokenFileRecord, TokenManifest,
                                           read_lake_token_manifests, token_dir)
from datahub.storage.bandwidth import BandwidthCap
from datahub.storage.config import StorageConfig
from datahub.storage.tier import STALE_PARTIAL_S, Tier

log = logging.getLogger(__name__)

LINEAGE_IDS_BYTES = 8 << 20  # ``.ids`` bytes turned into lineage rows at a time

HashedParts = set[tuple[str, str, str]]
"""(tier, part URI, sha256) of the token parts one tier apply has read and found matching: a delete later in the
same apply checks their size only, not every byte again (a cross-region move would read them over the link twice)."""


@dataclass(frozen=True)
class TokenFileSet:
    """Some of a release's token files with respect to one tier: (manifest, indices of its files) per tokenizer."""

    tier: str
    todo: tuple[tuple[TokenManifest, tuple[int, ...]], ...]

    @property
    def files(self) -> int:
        return sum(len(indices) for _, indices in self.todo)

    @property
    def bytes(self) -> int:
        return sum(manifest.files[i].part(p).size for manifest, indices in self.todo for i in indices for p in PARTS)


@dataclass(frozen=True)
class TokenCopies(TokenFileSet):
    """What a tier lacks of a release's token files."""

    def sources(self, storage: StorageConfig) -> list[str]:
        """The other configured tiers holding a replica of one of the files (a plan's ``source``)."""
        return sorted({t for manifest, indices in self.todo for i in indices for t in manifest.files[i].replicas
                       if t in storage.tiers and t != self.tier})


def token_copies(lake: Lake, release: str, tier: str, storage: StorageConfig, *, verify: bool = False,
                 cap: BandwidthCap | None = None, manifests: Sequence[TokenManifest] | None = None) -> TokenCopies:
    """The token files of ``release`` that ``tier`` holds no replica of, or a damaged one (a part missing or of the
    wrong size; with ``verify``, of the wrong sha256, read under ``cap``), and that a configured tier can give. A
    file no other configured tier holds (another region's storage config) is left out, logged. ``manifests``: the
    release's token manifests when the caller read them already."""
    target = storage.tier(tier) if tier in storage.tiers else None
    todo = []
    for manifest in manifests if manifests is not None else read_lake_token_manifests(lake, release):
        indices = tuple(i for i, record in enumerate(manifest.files)
                        if tier not in record.replicas or (target is not None and _damaged(record, target, verify, cap)))
        if not indices:
            continue
        unreachable = [manifest.files[i].prefix for i in indices
                       if not any(t in storage.tiers and t != tier for t in manifest.files[i].replicas)]
        if unreachable:
            log.warning("release %r: token files %s (tokenizer %s) have no other replica on a configured tier; not "
                        "copied to %s (pass the storage config of the tier that holds them)", release,
                        unreachable[:3], manifest.tokenizer.sha256[:12], tier)
            indices = tuple(i for i in indices if manifest.files[i].prefix not in unreachable)
        if indices:
            todo.append((manifest, indices))
    return TokenCopies(tier, tuple(todo))


def _damaged(record: TokenFileRecord, tier: Tier, verify: bool, cap: BandwidthCap | None) -> bool:
    """The file's replica on ``tier`` (the manifest names it) misses a part or has one of the wrong size/sha256."""
    if tier.name not in record.replicas:
        return False
    for part in PARTS:
        uri, expected = f"{record.replicas[tier.name]}.{part}", record.part(part)
        if tier.size(uri) != expected.size or (verify and not tier.verify(uri, size=expected.size,
                                                                          sha256=expected.sha256, cap=cap)):
            return True
    return False


def copy_token_files(lake: Lake, release: str, dest: Tier, *, storage: StorageConfig, workers: int = 2,
                     cap: BandwidthCap | None = None, verify: bool = False, hashed: HashedParts | None = None) -> int:
    """Copy the token files ``dest`` lacks or holds damaged (by size; sha256 too with ``verify``; see the module
    docstring); returns how many. Each part verified on ``dest`` goes into ``hashed`` when given."""
    copies = token_copies(lake, release, dest.name, storage, verify=verify, cap=cap)
    for manifest, indices in copies.todo:
        folder = token_dir(manifest.tokenizer.sha256)
        parts = [(index, part) for index in indices for part in PARTS]
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="datahub-token-copy") as pool:
            # every part is copied (or found intact) before any file is named: a failure stops the apply here
            for (index, part), _ in zip(parts, pool.map(lambda job: _copy_part(manifest, job[0], job[1], dest,
                                                                               storage, cap, hashed), parts)):
                if part == PARTS[-1]:
                    checkpoint(f"tier:after_token_file:{index}")  # crash tests: on the tier, not yet named
        replicas = {i: {**manifest.files[i].replicas, dest.name: dest.uri(release, folder, manifest.files[i].prefix)}
                    for i in indices}
        updated = replace(manifest, files=tuple(replace(record, replicas=replicas.get(i, record.replicas))
                                                for i, record in enumerate(manifest.files)))
        _commit_lineage(lake, updated, dest, cap=cap)
        publish_token_manifest(lake, updated, [dest, *(storage.tier(t) for t in updated.tiers
                                                       if t != dest.name and t in storage.tiers)],
                               between="tier:after_token_tier_manifest")
        # what a killed copy left there (temp files, open uploads); not a live writer's (see Tier.sweep_partials)
        dest.sweep_partials(dest.uri(release, folder), older_than=STALE_PARTIAL_S)
    return copies.files


def _copy_part(manifest: TokenManifest, index: int, part: str, dest: Tier, storage: StorageConfig,
               cap: BandwidthCap | None, hashed: HashedParts | None = None) -> None:
    """``_put_part``, then the part (now verified on ``dest``) into ``hashed``."""
    uri = _put_part(manifest, index, part, dest, storage, cap)
    if hashed is not None:
        hashed.add((dest.name, uri, manifest.files[index].part(part).sha256))


def _put_part(manifest: TokenManifest, index: int, part: str, dest: Tier, storage: StorageConfig,
              cap: BandwidthCap | None) -> str:
    """One part of one token file onto ``dest``: kept if already intact there, else streamed from the first
    replica that matches the manifest, then read back and checked; returns its URI there."""
    record = manifest.files[index]
    expected = record.part(part)
    uri = f"{dest.uri(manifest.release, token_dir(manifest.tokenizer.sha256), record.prefix)}.{part}"
    if dest.verify(uri, size=expected.size, sha256=expected.sha256, cap=cap):
        return uri  # a killed apply copied it already
    problems = []
    for name, prefix_uri in record.replicas.items():
        if name not in storage.tiers or name == dest.name:
            continue
        chunks = _Metered(storage.tier(name), f"{prefix_uri}.{part}", cap)
        try:
            dest.publish_stream(uri, chunks, size=expected.size, sha256=expected.sha256)
        except (OSError, StorageError) as exc:
            if not chunks.failed:
                raise  # the destination failed: no other replica helps
            problems.append(f"{name}: {exc}")
            continue
        except IntegrityError:  # what the replica gave does not match the manifest: nothing was published
            problems.append(f"{name}: {prefix_uri}.{part} does not match the manifest's size/sha256")
            continue
        if not dest.verify(uri, size=expected.size, sha256=expected.sha256, cap=cap):
            raise IntegrityError(f"tier {dest.name}: {uri} does not match what was written (size {expected.size}, "
                                 f"sha256 {expected.sha256[:12]}...); check the tier's health and re-run")
        return uri
    raise IntegrityError(f"release {manifest.release!r}: no intact replica of token file {record.prefix}.{part} to "
                         f"copy from ({'; '.join(problems) or 'no configured tier holds one'}); re-export the tokens")


class _Metered:
    """A replica's chunks under ``cap``; ``failed`` tells a source error from the destination's."""

    def __init__(self, tier: Tier, uri: str, cap: BandwidthCap | None) -> None:
        self.tier, self.uri, self.cap, self.failed = tier, uri, cap, False

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.tier.chunks(self.uri):
                if self.cap is not None:
                    self.cap.take(len(chunk))
                yield chunk
        except (OSError, StorageError):
            self.failed = True
            raise


def _commit_lineage(lake: Lake, manifest: TokenManifest, dest: Tier, *, cap: BandwidthCap | None) -> None:
    """``exported`` events of the documents on ``dest``, as a token export to that tier writes them (ref
    ``{"tokens": PREFIX URI, "tier", "tokenizer", "document"}``, txn ``export-tokens/{release}/{tier}/{folder}``:
    a re-run, or a later export to that tier, is a no-op), from each copied ``.ids`` read a few MiB at a time."""
    folder = token_dir(manifest.tokenizer.sha256)

    def events() -> Iterator[tuple[pa.Array, pa.Array]]:
        for record in manifest.files:
            if dest.name not in record.replicas:
                continue
            head = json.dumps({"tokens": record.replicas[dest.name], "tier": dest.name,
                               "tokenizer": manifest.tokenizer.sha256})[:-1] + ', "document": '
            start = 0
            for keys in _ids(dest, f"{record.replicas[dest.name]}.ids", cap):
                positions = pa.array(np.arange(start, start + len(keys), dtype=np.int64)).cast(pa.string())
                yield keys, pc.binary_join_element_wise(pa.scalar(head), positions, pa.scalar("}"), "")
                start += len(keys)
            if start != record.documents:
                raise IntegrityError(f"{record.replicas[dest.name]}.ids: {start} sample ids, the manifest has "
                                     f"{record.documents} documents; re-export the tokens")

    commit_exported(lake, events(), txn=f"export-tokens/{manifest.release}/{dest.name}/{folder}", op=TOKENS_OP,
                    params_hash=str(manifest.export.get("key", "")),
                    metadata={"datahub.export": manifest.release, "datahub.tier": dest.name,
                              "datahub.tokenizer": folder})


def _ids(tier: Tier, uri: str, cap: BandwidthCap | None) -> Iterator[pa.Array]:
    """The sample ids of a ``.ids`` file, whole lines of about ``LINEAGE_IDS_BYTES`` at a time."""
    held = b""
    for chunk in _Metered(tier, uri, cap):
        held += chunk
        if len(held) >= LINEAGE_IDS_BYTES:
            cut = held.rfind(b"\n") + 1
            if cut:
                yield decode_ids(held[:cut], where=uri)
                held = held[cut:]
    if held:
        yield decode_ids(held, where=uri)


def token_replicas_on(tier: str, manifests: Sequence[TokenManifest]) -> TokenFileSet:
    """The token files whose manifest names a replica on ``tier`` (what moving the release's text off it removes)."""
    todo = tuple((manifest, indices) for manifest in manifests
                 if (indices := tuple(i for i, record in enumerate(manifest.files) if tier in record.replicas)))
    return TokenFileSet(tier, todo)


def check_other_replicas(held: TokenFileSet, storage: StorageConfig, *, cap: BandwidthCap | None = None,
                         hashed: HashedParts | None = None) -> None:
    """Refuse (``IntegrityError``, nothing changed) unless every token file in ``held`` has a replica on another
    configured tier whose every part matches the manifest by size and sha256 (read under ``cap``; a part in
    ``hashed``, checked by this apply already, by size only)."""
    for manifest, indices in held.todo:
        for index in indices:
            record = manifest.files[index]
            problems = []
            for name, prefix_uri in record.replicas.items():
                if name == held.tier or name not in storage.tiers:
                    continue
                tier = storage.tier(name)
                bad = [part for part in PARTS if not _matches(tier, f"{prefix_uri}.{part}", record.part(part), cap,
                                                              hashed or set())]
                if not bad:
                    break
                problems.append(f"{name}: .{', .'.join(bad)} missing or not matching the manifest")
            else:
                others = sorted(t for t in record.replicas if t != held.tier)
                why = "; ".join(problems) or f"other replicas on {others or 'no tier'}, none of them configured"
                raise IntegrityError(
                    f"release {manifest.release!r}: not removing its token files from tier {held.tier}: token file "
                    f"{record.prefix} (tokenizer {manifest.tokenizer.sha256[:12]}) has no other replica that matches "
                    f"the token manifest ({why}). Repair it first (`datahub tier apply --verify` copies intact "
                    "replicas over damaged ones), or pass the storage config of the tier that holds one (--storage "
                    "twice)")


def _matches(tier: Tier, uri: str, expected: FilePart, cap: BandwidthCap | None, hashed: HashedParts) -> bool:
    if (tier.name, uri, expected.sha256) in hashed:
        return tier.size(uri) == expected.size
    return tier.verify(uri, size=expected.size, sha256=expected.sha256, cap=cap)


def drop_token_replicas(lake: Lake, held: TokenFileSet, storage: StorageConfig) -> None:
    """Publish every token manifest in ``held`` without its replicas on ``held.tier`` (each remaining tier's copy,
    then the lake's), so no reader resolves them; the text manifest (whose naming the tier marks the delete
    unfinished) and the bytes stay for the caller."""
    for manifest, indices in held.todo:
        updated = replace(manifest, files=tuple(
            replace(record, replicas={t: u for t, u in record.replicas.items() if t != held.tier}) if i in indices
            else record for i, record in enumerate(manifest.files)))
        publish_token_manifest(lake, updated, [storage.tier(t) for t in updated.tiers
                                               if t != held.tier and t in storage.tiers],
                               between="tier:delete:after_token_tier_manifest")

"""Open a token file of a token manifest for ``PackedDataset``: the first tier whose replica matches the manifest.

Tiers are tried in ``tier_preference`` order, else the reader's region's first (``region=`` or ``DATAHUB_REGION``
and the tiers' ``region:`` labels: ``datahub.loader.regions``, as ``ReleaseDataset``), else by name. Only local and
cfs replicas are readable: token files are memory-mapped.

Each part (``.bin``, ``.idx``, ``.ids``) is memory-mapped once and checked against the manifest's size and, with
``verify``, sha256, a local file being hashed once per file identity per verdict store (``verified.VerifiedFiles``,
as ``ReleaseDataset`` does for shards). A missing or damaged replica fails over to the next tier (logged once per
tier); ``NoReadableReplicaError`` names each tier's problem when none is good.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from datahub.errors import IntegrityError, SpecError
from datahub.loader.errors import NoReadableReplicaError
from datahub.loader.regions import reader_region, region_order, region_preference, tier_regions
from datahub.loader.shard_source import default_verdicts_dir
from datahub.loader.storage_options import StorageArg, as_storage, tier_list
from datahub.loader.verified import Identity, VerifiedFiles
from datahub.shards.indexed import IndexedDataset
from datahub.shards.token_manifest import PARTS, TokenFileRecord

log = logging.getLogger("datahub.loader")

SUFFIXES = {"bin": ".bin", "idx": ".idx", "ids": ".ids"}


def local_path(uri: str) -> str | None:
    """The POSIX path of a local or cfs replica; None for a remote URI (token files are memory-mapped)."""
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    return None if "://" in uri else uri


def _map(path: str) -> tuple[Any, Identity]:
    """The file's bytes (read-only map) and its identity, both from one open file."""
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if stat.st_size == 0:
            return b"", identity
        return mmap.mmap(handle.fileno(), stat.st_size, prot=mmap.PROT_READ), identity


class TokenReplicas:
    """``open(record)``: an ``IndexedDataset`` over the first good replica among ``tiers`` (all tiers when None).

    ``release``, ``regions`` (tier -> region label) and ``cfs_tiers`` (configured cfs tiers, the reader's region's
    first) only word the errors: which file, which tiers, and the ``tier apply`` that brings it to a cfs tier."""

    def __init__(self, tiers: Sequence[str] | None, *, verify: bool | Literal["always"] = True,
                 verified: VerifiedFiles | None = None, release: str = "",
                 regions: Mapping[str, str | None] | None = None, cfs_tiers: Sequence[str] = ()) -> None:
        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always'; got {verify!r}")
        self.tiers = list(tiers) if tiers else None
        self.verify = verify
        self.verified = verified if verified is not None else VerifiedFiles(None, shared=False)
        self.release, self.regions, self.cfs_tiers = release, dict(regions or {}), list(cfs_tiers)
        self.hashed = 0  # parts hashed (the rest were known good by their identity, or not verified)
        self._logged: set[str] = set()

    def open(self, record: TokenFileRecord) -> IndexedDataset:
        tiers = self.tiers or sorted(record.replicas)
        problems: dict[str, str] = {}
        local = [tier for tier in tiers if local_path(record.replicas.get(tier, "x://")) is not None]
        left_out = [tier for tier in sorted(record.replicas)
                    if tier not in tiers and local_path(record.replicas[tier]) is not None]
        if not local and left_out:  # a typo or a stale list in tier_preference, not a release to copy
            raise SpecError(f"token file {record.prefix}{self._of_release()}: no local replica among tier_preference "
                            f"{list(tiers)}, which leaves out every tier holding one ({self._named(left_out)}): add "
                            "one to tier_preference, or leave it out")
        if not local:
            raise SpecError(f"token file {record.prefix}{self._of_release()}: no local replica (cfs or local disk) "
                            f"among tiers {self._named(tiers)} (replicas on {self._named(record.replicas)}); PackedDataset "
                            f"memory-maps token files, so it reads them from a cfs mount or a local disk only. "
                            f"{self._fix(record)}")
        for n, tier in enumerate(local):
            path = local_path(record.replicas[tier])
            assert path is not None
            try:
                return self._open(record, path)
            except (OSError, IntegrityError) as error:
                problems[tier] = str(error) if isinstance(error, IntegrityError) else f"{type(error).__name__}: {error}"
                if tier not in self._logged:
                    self._logged.add(tier)
                    log.warning("token file %s: replica on tier %s unusable (%s); %s; further failures on %s are "
                                "not logged", record.prefix, tier, problems[tier],
                                "no other tier left" if n == len(local) - 1 else "failing over to the next tier", tier)
        tried = "; ".join(f"{tier} ({problem})" for tier, problem in problems.items())
        release = self.release or "RELEASE"
        raise NoReadableReplicaError(f"no readable replica of token file {record.prefix}{self._of_release()}: "
                                     f"{tried}. Copy intact replicas over the damaged ones with `datahub tier apply "
                                     f"--lake LAKE --storage STORAGE.yaml --release {release} --verify` (from a tier "
                                     "holding an intact one), or re-run `datahub export --tokenizer` to that tier.")

    def _of_release(self) -> str:
        return f" of release {self.release!r}" if self.release else ""

    def _named(self, tiers: Sequence[str] | Mapping[str, str]) -> str:
        """Tiers with their region labels: ``ceph-eu (eu-west), cfs``."""
        return ", ".join(f"{tier} ({self.regions[tier]})" if self.regions.get(tier) else tier for tier in tiers)

    def _fix(self, record: TokenFileRecord) -> str:
        """The command that copies the release, token files included, to a cfs tier as well."""
        target = next((tier for tier in self.cfs_tiers if tier not in record.replicas), "CFS_TIER")
        tiers = ",".join([*sorted(record.replicas), target])
        return (f"Copy the release to a cfs tier this machine mounts (token files follow its text shards): "
                f"`datahub tier apply --lake LAKE --storage STORAGE.yaml --release {self.release or 'RELEASE'} "
                f"--tiers {tiers}`, or pass tier_preference= with a tier that holds a local copy.")

    def _open(self, record: TokenFileRecord, path: str) -> IndexedDataset:
        data: dict[str, Any] = {}
        for part in PARTS:
            data[part], identity = _map(path + SUFFIXES[part])
            self._check(record, part, path + SUFFIXES[part], data[part], identity)
        return IndexedDataset.from_buffers(data["bin"], data["idx"], bytes(data["ids"]), where=path)

    def _check(self, record: TokenFileRecord, part: str, where: str, data: Any, identity: Identity) -> None:
        expected = record.part(part)
        if len(data) != expected.size:
            raise IntegrityError(f"{where}: size {len(data)} bytes, manifest says {expected.size}")
        if not (self.verify and expected.sha256):
            return
        digests: list[str] = []

        def matches() -> bool:
            self.hashed += 1
            digests.append(hashlib.sha256(data).hexdigest())  # releases the GIL
            return digests[-1] == expected.sha256

        if matches() if self.verify == "always" else self.verified.check(expected.sha256, identity, matches):
            return
        raise IntegrityError(f"{where}: sha256 {digests[-1][:12]}... does not match manifest {expected.sha256[:12]}...")


def open_replicas(records: Sequence[TokenFileRecord], tiers: Sequence[str] | None, *,
                  verify: bool | Literal["always"], verdicts_dir: str | os.PathLike[str] | None,
                  storage: StorageArg = None, region: str | None = None, release: str = "") -> list[IndexedDataset]:
    """Every record's good replica; the verdict store is ``verdicts_dir`` (default: the user's, as for shards).
    ``tiers`` None: the reader's region's tiers first (``region`` or ``DATAHUB_REGION``, labels from ``storage``)."""
    storage_config = as_storage(storage)
    tiers = tier_list(tiers)  # "cfs" alone is ["cfs"]
    if tiers is None:
        tiers = region_preference(sorted({tier for record in records for tier in record.replicas}), storage_config,
                                  region)
    regions = tier_regions(storage_config)
    cfs = [] if storage_config is None or isinstance(storage_config, Mapping) else [
        name for name, spec in storage_config.tiers.items() if spec.kind == "cfs"]
    directory = verdicts_dir if verdicts_dir is not None else default_verdicts_dir(None)
    replicas = TokenReplicas(tiers, verify=verify, verified=VerifiedFiles(directory, shared=verify is True),
                             release=release, regions=regions,
                             cfs_tiers=region_order(cfs, regions, reader_region(region)))
    return [replicas.open(record) for record in records]

"""Export a frozen table version as deterministic WebDataset shards on one tier, plus its manifest.

Order of effects (each step idempotent, so a crashed export is simply re-run):
1. each shard is published atomically and journalled under ``{release}/_partial/{export_key}/``;
   a re-run verifies journalled shards (size + sha256 at the destination) and skips them;
2. the shard index goes to the lineage table (action ``exported``) in one commit with txn
   ``export/{release}/{tier}``;
3. the manifest is published last: in the tier's export directory, then under the lake.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import IntegrityError, ReleaseError, SpecError
from datahub.export.manifest import Manifest, ShardRecord, publish_lake_manifest, read_lake_manifest
from datahub.export.samples import KEY_COLUMN, encode_tar, prepare
from datahub.export.tar import BLOCK, RECORD, end_of_archive
from datahub.loader.tar_index import index_member, index_tar
from datahub.pipeline.faults import checkpoint
from datahub.storage.config import StorageConfig
from datahub.storage.tier import Tier

DEFAULT_SHARD_SIZE = 256 * 1000 * 1000
EXPORT_OP = "export@1"
FORMAT = "webdataset-ustar-1"
_RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}

Progress = Callable[..., None]
# bounds on the __index__ member's size: key (<= 90 chars) and newline per sample; its header, trailer,
# extension list and padding once per shard
_INDEX_PER_SAMPLE = 91
_INDEX_FIXED = 3 * BLOCK + 255 * 10


def parse_size(value: str | int) -> int:
    """``256MB`` -> 256000000, ``1GiB`` -> 1073741824, ``40960`` -> 40960."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise SpecError(f"--shard-size: cannot parse {value!r}; use e.g. 256MB, 1GiB or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def shard_name(release: str, index: int) -> str:
    return f"{release}-{index:06d}.tar"


@dataclass(frozen=True)
class _Done:
    index: int
    name: str
    size: int
    sha256: str
    samples: int
    start: int
    end: int


def export_release(lake: Any, release_name: str, *, tier: str | Tier, storage: StorageConfig | None = None,
                   **options: Any) -> Manifest:
    """Export a release by name (resolved through ``datahub.release``) — see ``export_table_version``."""
    try:
        from datahub.release import get_release  # type: ignore[attr-defined]
    except ImportError:
        raise ReleaseError(
            f"release {release_name!r}: datahub.release is not available in this install, so release names "
            "cannot be resolved; export a table version instead (export_table_version(table=..., version=...))"
        ) from None
    release = get_release(lake, release_name)
    return export_table_version(lake, table=release.table, version=int(release.version), release_name=release.name,
                                release_digest=release.digest, tier=tier, storage=storage, **options)


def export_table_version(
    lake: Any,
    *,
    table: str,
    version: int,
    release_name: str,
    tier: str | Tier,
    storage: StorageConfig | None = None,
    shard_size: int | str | None = None,
    shard_samples: int | None = None,
    shuffle_seed: int | None = None,
    release_digest: str | None = None,
    progress: Progress | None = None,
    upload_workers: int = 1,
) -> Manifest:
    """Write ``table`` at Delta ``version`` as shards ``{release}-NNNNNN.tar`` on ``tier``; return the manifest.

    Same table version + settings -> byte-identical shards. Exporting again to the same tier
    is a no-op; to another tier it adds that tier's replicas to the manifest. Shard N+1 is built
    while shard N uploads; ``upload_workers`` uploads run at once (1 keeps publishes in shard order).
    """
    if not _RELEASE_NAME.match(release_name):
        raise SpecError(f"release name {release_name!r}: use letters, digits, '.', '_' or '-' (max 128, no '/')")
    target = _resolve_tier(tier, storage)
    if shard_samples is not None and shard_samples < 1:
        raise SpecError(f"--shard-samples must be >= 1, got {shard_samples}")
    size_limit = parse_size(shard_size) if shard_size is not None else (None if shard_samples else DEFAULT_SHARD_SIZE)
    if size_limit is not None and size_limit < RECORD:
        raise SpecError(f"--shard-size must be at least {RECORD} bytes (one tar record), got {size_limit}")
    if upload_workers < 1:
        raise SpecError(f"upload_workers must be >= 1, got {upload_workers}")
    settings = {"table": table, "table_version": int(version), "shard_size": size_limit, "shard_samples": shard_samples,
                "shuffle_seed": shuffle_seed, "format": FORMAT}
    export_key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    report = progress or (lambda stage, done, total=None: None)

    existing = read_lake_manifest(lake, release_name)
    if existing is not None and existing.export.get("key") != export_key:
        raise ReleaseError(
            f"release {release_name!r} was exported before with other settings ({existing.export.get('settings')}); "
            "shards of a release are immutable: export under a new release name, or copy replicas with `datahub tier apply`"
        )
    if existing is not None and target.name in existing.tiers:
        return existing  # already exported to this tier: applying twice is a no-op

    journal = _Journal(target, release_name, export_key)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-journal") as early:
        # reading the journal (and opening the tier's connection) overlaps the Delta read and sort
        verifying = early.submit(journal.verified)
        data = prepare(lake.read(table, version=version), shuffle_seed=shuffle_seed,
                       where=f"{lake.root}/{table}@v{version}")
        done = verifying.result()
    start = done[-1].end if done else 0
    report("shards", len(done), None)
    for shard in _write_shards(data.slice(start), target, release_name, first_index=len(done), first_row=start,
                               shard_size=size_limit, shard_samples=shard_samples, upload_workers=upload_workers,
                               record=journal.record):
        done.append(shard)
        report("shards", len(done), None)
        checkpoint(f"export:after_shard:{shard.index}")  # crash tests: published and journalled, more to come

    if existing is not None:  # a second tier: the shards must be the very same bytes
        if len(existing.shards) != len(done):
            raise IntegrityError(f"release {release_name!r}: re-export made {len(done)} shards, the manifest has "
                                 f"{len(existing.shards)}; the table version changed underneath?")
        for old, new in zip(existing.shards, done):
            if (old.name, old.sha256) != (new.name, new.sha256):
                raise IntegrityError(f"{new.name}: re-export differs from the published shard (sha256 "
                                     f"{new.sha256[:12]} vs {old.sha256[:12]}); the table version changed underneath?")
    ids = data[KEY_COLUMN]
    _commit_lineage(lake, release_name, target, done, ids, export_key)
    checkpoint("export:before_manifest")
    replicas = {s.name: {**(dict(existing.shards[s.index].replicas) if existing else {}),
                         target.name: target.uri(release_name, s.name)} for s in done}
    manifest = Manifest(
        release=release_name,
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if existing is None else existing.created,
        table=table, table_version=int(version),
        release_digest=release_digest or _content_digest(ids, table, version),
        num_samples=data.num_rows, shuffle_seed=shuffle_seed,
        shards=tuple(ShardRecord(name=s.name, size=s.size, sha256=s.sha256, samples=s.samples, replicas=replicas[s.name])
                     for s in done),
        export={"key": export_key, "settings": settings},
    )
    publish_manifest(lake, manifest, storage=storage, extra_tiers=[target])
    journal.clear()
    return manifest


def publish_manifest(lake: Any, manifest: Manifest, *, storage: StorageConfig | None,
                     extra_tiers: list[Tier] | None = None) -> None:
    """Publish the manifest into every tier that holds the release, then under the lake (the last step)."""
    tiers = {t.name: t for t in (extra_tiers or [])}
    for name in manifest.tiers:
        if name not in tiers and storage is not None and name in storage.tiers:
            tiers[name] = storage.tier(name)
    for name in manifest.tiers:
        if name in tiers:
            tiers[name].publish(tiers[name].uri(manifest.release, "manifest.json"), manifest.to_json())
    checkpoint("export:after_tier_manifest")  # crash tests: the lake's copy is what marks the export done
    publish_lake_manifest(lake, manifest)


def _resolve_tier(tier: str | Tier, storage: StorageConfig | None) -> Tier:
    if isinstance(tier, Tier):
        return tier
    if storage is None:
        raise SpecError(f"tier {tier!r}: no storage config given; pass --storage storage.yaml")
    return storage.tier(tier)


@dataclass(frozen=True)
class _Built:
    """One shard's bytes, built and waiting for upload."""

    index: int
    name: str
    body: bytes
    samples: int
    start: int


def index_reserve(member_bytes: Any, samples: Any) -> Any:
    """The most bytes the ``__index__`` member of a shard with these members can take: 10 index bytes per
    member (a member is at least one 512-byte block), a key (<= 90 characters) and newline per sample,
    and once its header, trailer, extension list (<= 255 names) and padding. Works on ints and arrays."""
    return _INDEX_FIXED + (member_bytes * 10 + BLOCK - 1) // BLOCK + samples * _INDEX_PER_SAMPLE


def _build_shards(rows: pa.Table, release: str, *, first_index: int, first_row: int,
                  shard_size: int | None, shard_samples: int | None) -> Iterator[_Built]:
    """Cut ``rows`` into shards in order. A shard closes before the sample that would take it past
    ``shard_size`` or at ``shard_samples``; a shard holds at least one sample (which alone may be larger).

    The size counts the whole file: the ``__index__`` member (see ``datahub.loader.tar_index``), the
    end-of-archive blocks and the padding to a full tar record, so a shard takes samples while
    ``written``, ``index_reserve(written, count)`` and 1024 bytes of end blocks stay within
    ``shard_size`` rounded down to a record."""
    pieces: list[pa.Buffer] = []
    written = count = 0
    index, start = first_index, first_row
    budget = (shard_size // RECORD) * RECORD - 2 * BLOCK - _INDEX_FIXED if shard_size is not None else 0

    def cost(size: Any, samples: Any) -> Any:  # bytes of members plus the most index they can need
        return size + index_reserve(size, samples) - _INDEX_FIXED

    def close() -> _Built:
        members = b"".join(pieces)
        embedded = index_member(index_tar(members, where=shard_name(release, index)), len(members))
        body = b"".join([members, embedded, end_of_archive(len(members) + len(embedded))])
        return _Built(index, shard_name(release, index), body, count, start)

    for samples in encode_tar(rows):
        offsets = np.frombuffer(samples.buffers()[1], dtype=np.int64)[samples.offset:samples.offset + len(samples) + 1]
        data = samples.buffers()[2]
        position, total = 0, len(samples)
        while position < total:
            take = total - position
            if shard_samples is not None:
                take = min(take, shard_samples - count)
            if shard_size is not None:  # how many of the next samples still fit, by cumulative size
                totals = written + (offsets[position + 1:] - offsets[position])
                needs = cost(totals, count + np.arange(1, len(totals) + 1))  # grows with every sample taken
                take = min(take, int(np.searchsorted(needs, budget, side="right")))
            if count == 0:
                take = max(take, 1)
            if take:
                begin, stop = int(offsets[position]), int(offsets[position + take])
                pieces.append(data.slice(begin, stop - begin))
                written += stop - begin
                count += take
                position += take
            if position < total:  # the next sample does not fit: this shard is full
                yield close()
                index, start = index + 1, start + count
                pieces, written, count = [], 0, 0
    if count:
        yield close()


def _upload(tier: Tier, release: str, shard: _Built, record: Callable[[_Done], None]) -> _Done:
    """Hash the bytes we send, publish them, check the size the tier reports, journal the shard.

    Runs in an upload thread. Verification here is the size at the destination (one HEAD/stat) plus
    the sha256 of the exact bytes sent; a resume re-reads and re-hashes every journalled shard at the
    destination (``_Journal.verified``) before trusting it.
    """
    digest = hashlib.sha256(shard.body).hexdigest()  # hashlib releases the GIL: overlaps the next build
    uri = tier.uri(release, shard.name)
    tier.publish(uri, shard.body)
    if tier.size(uri) != len(shard.body):
        raise IntegrityError(f"tier {tier.name}: {uri} has the wrong size after writing; check the tier and re-run")
    done = _Done(shard.index, shard.name, len(shard.body), digest, shard.samples, shard.start,
                 shard.start + shard.samples)
    record(done)
    return done


def _write_shards(rows: pa.Table, tier: Tier, release: str, *, first_index: int, first_row: int,
                  shard_size: int | None, shard_samples: int | None, upload_workers: int = 1,
                  record: Callable[[_Done], None] = lambda shard: None) -> Iterator[_Done]:
    """Build shard N+1 while shard N uploads; yield finished shards in order.

    At most ``upload_workers`` uploads run at once and one more shard waits built, so memory stays
    at about ``(upload_workers + 2) * shard_size``. A failed upload raises here after the shards
    before it were journalled (``record``, called after each upload); a journal entry past a gap is
    ignored by ``_Journal.verified``, so a re-run uploads from the first unjournalled shard (same bytes).
    """
    built = _build_shards(rows, release, first_index=first_index, first_row=first_row, shard_size=shard_size,
                          shard_samples=shard_samples)
    with ThreadPoolExecutor(max_workers=upload_workers, thread_name_prefix="datahub-export-upload") as pool:
        pending: deque[Future[_Done]] = deque()
        try:
            for shard in built:
                pending.append(pool.submit(_upload, tier, release, shard, record))
                del shard  # the future holds the bytes until uploaded
                while len(pending) > upload_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


class _Journal:
    """Per-shard completion records, so a re-run skips verified shards without rebuilding them."""

    def __init__(self, tier: Tier, release: str, export_key: str) -> None:
        self.tier = tier
        self.release = release
        self.dir = tier.uri(release, "_partial", export_key)

    def _entry(self, index: int) -> str:
        return f"{self.dir}/{index:06d}.json"

    def record(self, shard: _Done) -> None:
        self.tier.publish(self._entry(shard.index), json.dumps(shard.__dict__).encode())

    def verified(self) -> list[_Done]:
        done: list[_Done] = []
        while True:
            try:
                entry = _Done(**json.loads(self.tier.read(self._entry(len(done)))))
            except FileNotFoundError:
                return done
            uri = self.tier.uri(self.release, entry.name)
            if not self.tier.verify(uri, size=entry.size, sha256=entry.sha256):
                return done  # rebuild from this shard on
            done.append(entry)

    def clear(self) -> None:
        """Drop the journals of this release (any export key: only the published one matters now),
        and the temp file of a shard whose upload a killed export left behind."""
        self.tier.delete(self.dir.rsplit("/", 1)[0], recursive=True)
        self.tier.sweep_partials(self.tier.uri(self.release))


def _commit_lineage(lake: Any, release: str, tier: Tier, shards: list[_Done], ids: pa.ChunkedArray, export_key: str) -> None:
    from datahub.lake.tables import LINEAGE

    txn = f"export/{release}/{tier.name}"
    if lake.applied("lineage", txn):
        return
    chunks = []
    for shard in shards:
        keys = ids.slice(shard.start, shard.samples)
        prefix = json.dumps({"shard": tier.uri(release, shard.name), "tier": tier.name})[:-1] + ', "member": "'
        ref = pc.binary_join_element_wise(pa.scalar(prefix), keys, pa.scalar('.txt"}'), "")
        chunks.append(pa.table({"sample_id": keys, "ref": ref}))
    index = pa.concat_tables(chunks) if chunks else pa.table({"sample_id": pa.array([], pa.string()),
                                                               "ref": pa.array([], pa.string())})
    n = index.num_rows
    now = datetime.now(timezone.utc)
    rows = pa.table({
        "sample_id": index["sample_id"],
        "run_id": pa.array([txn] * n, pa.string()),
        "op": pa.array([EXPORT_OP] * n, pa.string()),
        "params_hash": pa.array([export_key] * n, pa.string()),
        "action": pa.array(["exported"] * n, pa.string()),
        "reason": pa.nulls(n, pa.string()),
        "ref": index["ref"],
        "ts": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    }, schema=LINEAGE).sort_by([("sample_id", "ascending")])
    lake.commit("lineage", rows, txn=txn, schema=LINEAGE, metadata={"datahub.export": release, "datahub.tier": tier.name})


def _content_digest(ids: pa.ChunkedArray, table: str, version: int) -> str:
    """Stand-in for a release digest when exporting a bare table version: table, version and ids in order."""
    return hashlib.sha256("\n".join([f"{table}@{version}", *ids.to_pylist()]).encode()).hexdigest()

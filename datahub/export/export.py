"""Export a frozen table version as deterministic WebDataset shards on one tier, plus its manifest.

Flow:
- in this process (memory: a few shards and one bucket of the plan, whatever the release's size): a pass over
  ``sample_id`` alone (row count; in id order a sample of ids for the buckets' key ranges), then one read of every
  column, each row encoded once (its tar members) and appended to its key bucket's spill file
  (``datahub.export.spill.BucketSpill``), its small record (id, order hash, place, sizes) to the bucket's records;
  each bucket is then sorted on its own and shards are cut across the buckets in order (``plan.sort_buckets``);
  each shard is gathered from the spill in export order into a reused buffer, framed and uploaded while the next
  one is gathered; lineage and the content digest read the sorted records back;
- on Ray: tasks read and encode each data file once into a run sorted in export order on their node's disk
  (``datahub.engines.ray.export.spill_runs``) and send back ids, order hashes and sizes; the driver plans on its
  local disk as an export in this process does (``plan.SummaryPlan``: key buckets sorted one at a time, shards cut
  across them) and writes, per shard, the row of each run where its rows begin; write tasks each read their
  shard's slice of every run and publish the whole shard (``write_slices``, ``datahub.export.write``), returning
  small results;
- on Spark: the same plan on local disk from one pass of tasks over ids and sizes, then tasks encode and route rows
  to their shards by the shards' first keys and each publish whole shards.

Order of effects (each step idempotent, so a crashed export is simply re-run):
1. each shard is published atomically and journalled under ``{release}/_partial/{export_key}-{table id}/``
   (``TableSource.journal_key``: another lake's journal on a shared tier is never taken);
   a re-run verifies journalled shards (size + sha256 at the destination) and skips them;
2. the shard index goes to the lineage table (action ``exported``) in one commit with txn
   ``export/{release}/{tier}`` and the export key in its metadata; a re-run with other settings after that
   commit is refused (``exported_lineage.refuse_other_export``);
3. the manifest is published last: in the tier's export directory, then under the lake.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import logging
import mmap
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.allocator import arrow_pool
from datahub.engines.base import Engine
from datahub.engines.registry import engine_in_scope
from datahub.errors import IntegrityError, ReleaseError, SpecError
from datahub.shards.manifest import (Manifest, ShardRecord, lake_manifest_uri, publish_lake_manifest,
                                     read_lake_manifest)
from datahub.export.plan import (ORDER, BucketPlan, IdSample, KeyBuckets, SummaryPlan, bucket_count, checked_ids,
                                 export_ordering, index_reserve, member_bytes, order_hash, sort_buckets)
from datahub.export.samples import (KEY_COLUMN, TEXT_COLUMN, binary_columns, encoded_rows, export_columns,
                                    member_data)
from datahub.export.exported_lineage import refuse_other_export
from datahub.export.scratch import EXPORT_PREFIX, scratch_dir, sweep_stale
from datahub.export.source import TableSource
from datahub.export.spill import BucketSpill, RecordSpill, bucket_bytes, buckets_allowed
from datahub.shards.index import ShardIndex, index_member
from datahub.shards.tar import BLOCK, RECORD, end_of_archive, header_blocks
from datahub.export.write import ROUTED, ShardDone, ShardWriter, hashing_thread, shard_name
from datahub.export.exported_lineage import commit_shard_index
from datahub.lake.lake import Lake, fsspec_options
from datahub.pipeline.faults import checkpoint
from datahub.progress import Progress
from datahub.release.records import get_release
from datahub.storage.config import StorageConfig
from datahub.storage.tier import STALE_PARTIAL_S, Tier

__all__ = ["export_release", "export_table_version", "index_reserve", "parse_size", "publish_manifest", "shard_name"]

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256 * 1000 * 1000
EXPORT_OP = "export@1"
FORMAT = "webdataset-ustar-1"
_RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}

EngineChoice = Literal["local", "ray", "spark"] | Engine


def _no_progress(stage: str, done: int, total: int | None) -> None:
    """The ``progress`` of a caller that passes none."""


def parse_size(value: str | int) -> int:
    """``256MB`` -> 256000000, ``1GiB`` -> 1073741824, ``40960`` -> 40960."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise SpecError(f"--shard-size: cannot parse {value!r}; use e.g. 256MB, 1GiB or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _settings_difference(before: Any, now: Mapping[str, Any]) -> str:
    """What differs from an earlier export's settings, and the options that export again with them."""
    if not isinstance(before, Mapping):
        return f"the manifest records {before!r}"
    def shown(value: Any) -> str:
        return "none" if value is None else str(value)

    differs = [f"{key}: {shown(now.get(key))} now, {shown(before.get(key))} before"
               for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]
    options = []
    if before.get("shard_size") is not None and (before.get("shard_samples") is not None
                                                 or before["shard_size"] != DEFAULT_SHARD_SIZE):
        options.append(f"--shard-size {before['shard_size']}")
    for key, option in (("shard_samples", "--shard-samples"), ("shuffle_seed", "--shuffle-seed")):
        if before.get(key) is not None:
            options.append(f"{option} {before[key]}")
    same = " ".join(options) or "no --shard-size, --shard-samples or --shuffle-seed"
    return "; ".join(differs) + f"; to add a tier to that export, run it with {same}"


def export_release(lake: Lake, release_name: str, *, tier: str | Tier, storage: StorageConfig | None = None,
                   **options: Any) -> Manifest:
    """Export a release by name (resolved through ``datahub.release.records``) — see ``export_table_version``."""
    release = get_release(lake, release_name)
    return export_table_version(lake, table=release.table, version=int(release.version), release_name=release.name,
                                release_digest=release.digest, tier=tier, storage=storage, **options)


def export_table_version(
    lake: Lake,
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
    upload_workers: int = 2,
    engine: EngineChoice = "local",
    workers: int | None = None,
    verify: bool = False,
    spill_dir: str | None = None,
    bucket_rows: int | None = None,
) -> Manifest:
    """Write ``table`` at Delta ``version`` as shards ``{release}-NNNNNN.tar`` on ``tier``; return the manifest.

    Same table version + settings -> byte-identical shards, whichever ``engine`` writes them ("local": this
    process, shard N+1 built while shard N uploads, ``upload_workers`` uploads at once; "ray"/"spark" or a
    started ``Engine``: tasks of ``workers`` at once each write whole shards to the tier). Memory is bounded
    by a few shards and (in this process) one bucket of the plan's records (``bucket_rows`` rows at most; the
    plan is sorted on local disk, bucket by bucket), not by the release. Exporting again to a tier
    that holds the release checks its replicas (size; sha256 too with ``verify``) and rewrites damaged ones;
    to another tier it adds that tier's replicas to the manifest.
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
    if workers is not None and workers < 1:
        raise SpecError(f"--workers must be >= 1, got {workers}")
    settings: dict[str, Any] = {"table": table, "table_version": int(version), "shard_size": size_limit,
                                "shard_samples": shard_samples, "shuffle_seed": shuffle_seed, "format": FORMAT}
    if shuffle_seed is not None:
        settings["order"] = ORDER  # exports before the keyed order have no "order": their key differs
    export_key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    report = progress or _no_progress
    source = TableSource(lake, table, int(version))
    sweep_stale(EXPORT_PREFIX, parent=spill_dir)  # what killed exports left (their runs: the release's size)

    withdrawn = read_withdrawal(lake, release_name)
    if withdrawn is not None:  # exporting again would publish a manifest without the mark: trainers read it again
        raise ReleaseError(f"release {release_name!r} was withdrawn at {withdrawn.get('at')} ({withdrawn.get('reason')}"
                           f"; `datahub tier remove`): it is not exported again; export the release that replaced it")
    existing = read_lake_manifest(lake, release_name)
    if existing is not None and existing.export.get("key") != export_key:
        raise ReleaseError(
            f"release {release_name!r} was exported before with other settings "
            f"({_settings_difference(existing.export.get('settings'), settings)}); shards of a release are immutable: "
            "export under a new release name, or copy replicas with `datahub tier apply`"
        )
    if existing is not None and target.name in existing.tiers:
        _repair(existing, target, source, settings, engine=engine, workers=workers, verify=verify,
                spill_dir=spill_dir, upload_workers=upload_workers, report=report, bucket_rows=bucket_rows)
        return existing  # already exported to this tier: applying twice is a no-op (after repairs)

    # the lineage of a first try killed after its lineage commit names that try's shards: other settings now would
    # publish other shards, and the lineage commit (applied) would be skipped
    refuse_other_export(lake, f"export/{release_name}/{target.name}", export_key, release=release_name,
                        tier=target.name)
    journal = _Journal(target, release_name, source.journal_key(export_key))
    with ExitStack() as scope:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-journal") as early:
            # reading the journal (and opening the tier's connection) overlaps the planning pass
            verifying = early.submit(journal.verified)
            running = engine_in_scope(engine, scope, purpose="export")
            plan, local = _plan_pass(source, settings, running=running, spill_dir=spill_dir, scope=scope,
                                     workers=workers, bucket_rows=bucket_rows)
            done = verifying.result()
        done = [d for d in done if d.index < len(plan.spans)
                and (d.samples, d.start) == (plan.spans[d.index].samples, plan.spans[d.index].start)]
        report("shards", len(done), len(plan.spans))
        writer = _writer(plan, target, release_name, shuffle_seed, journal_dir=journal.dir)
        # by index: the filter above may drop a middle entry (another plan's boundary) and keep later ones
        finished = {d.index for d in done}
        todo = [span.index for span in plan.spans if span.index not in finished]
        for shard in _write(source, writer, todo, plan=plan, local=local, running=running, workers=workers,
                            upload_workers=upload_workers):
            done.append(shard)
            report("shards", len(done), len(plan.spans))
            checkpoint(f"export:after_shard:{shard.index}")  # crash tests: published and journalled, more to come
        done.sort(key=lambda d: d.index)
        # still in the scope: the plan's records (on local disk, in this process) give the lineage and the digest

        if existing is not None:  # a second tier: the shards must be the very same bytes
            if len(existing.shards) != len(done):
                raise IntegrityError(f"release {release_name!r}: re-export made {len(done)} shards, the manifest has "
                                     f"{len(existing.shards)}; the table version changed underneath?")
            for old, new in zip(existing.shards, done):
                if (old.name, old.sha256) != (new.name, new.sha256):
                    raise IntegrityError(f"{new.name}: re-export differs from the published shard (sha256 "
                                         f"{new.sha256[:12]} vs {str(old.sha256)[:12]}); the table version changed "
                                         "underneath?")
            # the tier is not in the manifest until it is published: a tier apply meanwhile may take the directory for
            # a leftover; never publish replicas that are gone (one size look-up per shard)
            vanished = [s.name for s in done if target.size(target.uri(release_name, s.name)) != s.size]
            if vanished:
                more = " ..." if len(vanished) > 3 else ""
                raise IntegrityError(f"release {release_name!r}: shards {vanished[:3]}{more} "
                                     f"vanished from tier {target.name} during the export (a concurrent `datahub tier "
                                     "apply`?); re-run the export")
        commit_export_lineage(lake, release_name, target, done, lambda s: plan.shard_ids(s.index), export_key)
        checkpoint("export:before_manifest")
        replicas = {s.name: {**(dict(existing.shards[s.index].replicas) if existing else {}),
                             target.name: target.uri(release_name, s.name)} for s in done}
        manifest = Manifest(
            release=release_name,
            created=(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if existing is None
                     else existing.created),
            table=table, table_version=int(version),
            release_digest=release_digest or _content_digest(plan.id_chunks(), table, version),
            num_samples=plan.num_samples, shuffle_seed=shuffle_seed,
            shards=tuple(ShardRecord(name=s.name, size=s.size, sha256=s.sha256, samples=s.samples,
                                     replicas=replicas[s.name]) for s in done),
            export={"key": export_key, "settings": settings},
        )
        publish_manifest(lake, manifest, storage=storage, extra_tiers=[target])
    journal.clear()
    return manifest


def _plan_engine(source: TableSource, settings: dict[str, Any], *, running: Engine, scope: ExitStack,
                 spill_dir: str | None, bucket_rows: int | None) -> BucketPlan:
    """The planning pass on an engine (Spark; a Ray export plans from its runs: ``_plan_runs``): its tasks read the
    files and send back only ids, order hashes and sizes, planned on local disk (``SummaryPlan``)."""
    directory = scope.enter_context(scratch_dir(EXPORT_PREFIX, parent=spill_dir))
    planner = SummaryPlan(directory, shuffle_seed=settings["shuffle_seed"], where=source.where,
                          bucket_rows=bucket_rows, max_buckets=buckets_allowed())
    scope.callback(planner.close)  # before the folder goes (LIFO)
    batches = running.read_files(source.files(), SizesReader.of(source, settings["shuffle_seed"])).iter_batches()
    with closing(batches):  # a failed plan stops the engine's reads (Frame.iter_batches)
        for batch in batches:
            planner.add(batch)
    return planner.plan(shard_size=settings["shard_size"], shard_samples=settings["shard_samples"])


@dataclass(frozen=True)
class SizesReader:
    """A planning task's read: one data file's ``sample_id`` and the bytes each row takes in a shard (picklable)."""

    source: TableSource
    columns: tuple[str, ...]  # the export columns
    binary: tuple[str, ...]  # those written as members of their own
    shuffle_seed: int | None = None  # seeded: the rows' order hashes too (``order_hash``, uint64)

    @classmethod
    def of(cls, source: TableSource, shuffle_seed: int | None = None) -> SizesReader:
        schema = source.schema()
        columns = export_columns(schema, where=source.where)
        return cls(source, tuple(columns), tuple(binary_columns(pa.schema([schema.field(c) for c in columns]))),
                   shuffle_seed)

    def projection(self) -> dict[str, Any]:
        """The small columns as they are, the large ones as byte lengths (computed in the scan)."""
        projection: dict[str, Any] = {c: pc.field(c) for c in self.columns if c != TEXT_COLUMN and c not in self.binary}
        for column in [TEXT_COLUMN, *self.binary] if TEXT_COLUMN in self.columns else self.binary:
            projection[column] = pc.binary_length(pc.field(column))
        return projection

    def sizes(self, batch: pa.RecordBatch) -> pa.Table:
        json_columns = [c for c in self.columns if c != TEXT_COLUMN and c not in self.binary]
        size = member_bytes(batch, json_columns=json_columns, binary=list(self.binary))
        ids = checked_ids(batch.column(KEY_COLUMN), where=self.source.where)
        columns: dict[str, Any] = {KEY_COLUMN: ids, "size": pa.array(size, pa.int64())}
        if self.shuffle_seed is not None:
            columns["order_hash"] = pa.array(order_hash(ids, self.shuffle_seed), pa.uint64())
        return pa.table(columns)

    def __call__(self, file: str) -> Iterator[pa.Table]:
        for batch in self.source.scan(self.projection(), files=[file]):
            if batch.num_rows:
                yield self.sizes(batch)


@dataclass(frozen=True)
class _LocalRows:
    """A local export's encoded rows: the spill by key bucket, and the plan whose records say where each row is."""

    spill: BucketSpill
    plan: BucketPlan


def _listing(extensions: tuple[str, ...], sizes: np.ndarray, keys: list[str]) -> ShardIndex:
    """The index of rows (``sizes``: rows x extensions, data bytes, -1 where a row has no such member) written
    back to back from offset 0 (what ``index_rows`` finds in those bytes)."""
    present = sizes >= 0
    owner, column = np.nonzero(present)  # row by row, members in row order
    size = sizes[present]
    used = sorted(set(column.tolist()))
    names = tuple(dict.fromkeys(extensions[c] for c in used))  # a shard lists the extensions it holds
    codes = np.zeros(len(extensions), dtype=np.int64)
    for c in used:
        codes[c] = names.index(extensions[c])
    spans = BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    offset = np.empty(len(size), dtype=np.int64)
    if len(size):
        offset[0] = BLOCK
        np.cumsum(spans[:-1], out=offset[1:])
        offset[1:] += BLOCK
    return ShardIndex(keys=keys, extensions=names, member_sample=owner.astype(np.int64), member_ext=codes[column],
                      member_offset=offset, member_size=size)


@dataclass(frozen=True)
class SortedRunReader:
    """A Ray export's read task: one data file of the version encoded once, its rows (order hash, id, tar members)
    sorted in export order, and their ids, shard bytes and order hashes (seeded) for the plan (picklable)."""

    source: TableSource
    columns: tuple[str, ...]
    shuffle_seed: int | None

    def __call__(self, file: str) -> tuple[pa.Table, pa.Table]:
        where = self.source.where
        id_chunks: list[pa.Array] = []
        member_chunks: list[pa.Array] = []
        for batch in self.source.scan(list(self.columns), files=[file]):
            if batch.num_rows:
                id_chunks.append(checked_ids(batch.column(KEY_COLUMN), where=where))
                member_chunks.append(encoded_rows(batch))
        ids = pa.chunked_array(id_chunks, pa.string()).combine_chunks() if id_chunks else pa.array([], pa.string())
        members = pa.chunked_array(member_chunks, pa.large_binary()) if member_chunks else \
            pa.chunked_array([], pa.large_binary())
        del id_chunks, member_chunks
        ordered, hashes, positions = export_ordering(ids, shuffle_seed=self.shuffle_seed, where=where)
        members = members.take(pa.array(positions))
        bits = hashes.view(np.int64) if hashes is not None else np.zeros(len(ordered), dtype=np.int64)
        rows = pa.table([pa.array(bits, pa.int64()), ordered, members], schema=RUN_ROWS)
        summary: dict[str, Any] = {KEY_COLUMN: ordered, "size": pc.binary_length(members).cast(pa.int64())}
        if hashes is not None:
            summary["order_hash"] = pa.array(hashes, pa.uint64())
        return rows, pa.table(summary)


RUN_ROWS = pa.schema([f for f in ROUTED if f.name != "shard"])


@dataclass(frozen=True)
class _EngineRuns:
    """A Ray export's encoded rows: sorted runs on the workers' disks, and a file on the driver's disk (``bounds``)
    of shards + 1 rows of one int64 per run: the row of the run where each shard's rows begin (a run is in export
    order, so a shard's rows of it are contiguous). Read two rows per shard, never held whole (runs x shards)."""

    runs: tuple[Any, ...]  # datahub.engines.ray.export.Run
    bounds: str

    def slices(self, index: int) -> list[tuple[int, int, int]]:
        count = len(self.runs)
        begin, end = np.fromfile(self.bounds, dtype=np.int64, count=2 * count, offset=8 * index * count).reshape(2, count)
        return [(run, int(begin[run]), int(end[run])) for run in np.flatnonzero(end > begin).tolist()]


def _plan_runs(source: TableSource, settings: dict[str, Any], *, running: Engine, scope: ExitStack,
               spill_dir: str | None, workers: int | None,
               bucket_rows: int | None) -> tuple[BucketPlan, _EngineRuns]:
    """The Ray export's one read of the version: tasks encode their files into sorted runs on local disk and send
    back ids, order hashes and sizes, each row tagged here with its run and row in it; the plan is made on local
    disk from those (``SummaryPlan``), then each run's rows are split between the shards (``_write_run_bounds``)."""
    ray_export = importlib.import_module("datahub.engines.ray.export")
    where = source.where
    directory = scope.enter_context(scratch_dir(EXPORT_PREFIX, parent=spill_dir))
    runs: list[Any] = []
    scope.callback(lambda: ray_export.remove_runs(running, runs, directory))  # other nodes' runs (before the folder)
    planning = os.path.join(directory, "plan")  # the driver's files, beside this node's runs
    os.makedirs(planning)
    planner = SummaryPlan(planning, shuffle_seed=settings["shuffle_seed"], where=where, bucket_rows=bucket_rows,
                          max_buckets=buckets_allowed())
    scope.callback(planner.close)
    reader = SortedRunReader(source, tuple(export_columns(source.schema(), where=where)), settings["shuffle_seed"])
    for run, summary in ray_export.spill_runs(running, source.files(), read=reader, directory=directory,
                                              workers=workers):
        if summary.num_rows != run.rows:
            raise IntegrityError(f"{where}: a read task sent {summary.num_rows} ids for a run of {run.rows} rows; "
                                 "re-run the export")
        summary = summary.append_column("run", pa.array(np.full(run.rows, len(runs), dtype=np.int32)))
        runs.append(run)
        planner.add(summary.append_column("row", pa.array(np.arange(run.rows, dtype=np.int64))))
    plan = planner.plan(shard_size=settings["shard_size"], shard_samples=settings["shard_samples"])
    bounds = os.path.join(planning, "bounds.int64")
    _write_run_bounds(plan, [run.rows for run in runs], bounds, where=where)
    return plan, _EngineRuns(tuple(runs), bounds)


def _write_run_bounds(plan: BucketPlan, run_rows: list[int], path: str, *, where: str) -> None:
    """Per shard (and once at the end) the row of every run where the shard's rows begin, as int64 rows of
    ``len(run_rows)`` to ``path``: the plan's records in export order, counted per run up to each shard's start.
    A run's rows must come in export order, row after row (its task sorted them as the plan does)."""
    count = len(run_rows)
    seen = np.zeros(count, dtype=np.int64)  # rows of each run ranked so far
    starts = [s.start for s in plan.spans]
    shard = 0
    with open(path, "wb") as out:
        for first, records in plan.records():
            run = np.asarray(records.column("run"), dtype=np.int64)
            row = np.asarray(records.column("row"), dtype=np.int64)
            order = np.argsort(run, kind="stable")  # by run, export order within one
            grouped = run[order]
            cuts = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
            firsts = np.concatenate([[0], cuts]).astype(np.int64)
            within = np.arange(len(run), dtype=np.int64) - np.repeat(firsts, np.diff(np.append(firsts, len(run))))
            if not np.array_equal(row[order], seen[grouped] + within):
                raise IntegrityError(f"{where}: a read task's rows came back out of export order; re-run the export")
            position = 0
            while shard < len(starts) and starts[shard] < first + len(run):
                cut = starts[shard] - first
                seen += np.bincount(run[position:cut], minlength=count)
                seen.tofile(out)
                position, shard = cut, shard + 1
            seen += np.bincount(run[position:], minlength=count)
        if shard != len(starts) or not np.array_equal(seen, np.asarray(run_rows, dtype=np.int64)):
            raise IntegrityError(f"{where}: the plan holds {int(seen.sum())} rows, the runs {sum(run_rows)}; "
                                 "re-run the export")
        seen.tofile(out)


def _plan_pass(source: TableSource, settings: dict[str, Any], *, running: Engine | None, spill_dir: str | None,
               scope: ExitStack, workers: int | None = None,
               bucket_rows: int | None = None) -> tuple[BucketPlan, _LocalRows | _EngineRuns | None]:
    """The plan, on local disk (its folder removed when ``scope`` closes); in this process also every row's encoded
    members, spilled by key bucket (the large columns read once). Ray tasks read and encode their files once, into
    sorted runs on local disk (``_plan_runs``); Spark tasks read sizes first and encode their rows later."""
    if running is not None and running.name == "ray":
        return _plan_runs(source, settings, running=running, scope=scope, spill_dir=spill_dir, workers=workers,
                          bucket_rows=bucket_rows)
    if running is not None:
        return _plan_engine(source, settings, running=running, scope=scope, spill_dir=spill_dir,
                            bucket_rows=bucket_rows), None
    return _plan_buckets(source, settings, spill_dir=spill_dir, scope=scope, bucket_rows=bucket_rows)


def _plan_buckets(source: TableSource, settings: dict[str, Any], *, spill_dir: str | None, scope: ExitStack,
                  bucket_rows: int | None) -> tuple[BucketPlan, _LocalRows]:
    """An export in this process: a pass over ``sample_id`` (the row count; in id order a sample of the ids for the
    buckets' splitters; a seeded export takes the count from the Delta log's statistics when they hold it,
    ``TableSource.live_rows``, and makes no such pass), then one read of every column: each row encoded once, its
    members appended to its key bucket's spill file and its record (id, order hash, place, member sizes) to the
    bucket's records; then each bucket is sorted on its own and the shards cut across them in order
    (``plan.sort_buckets``). The driver holds a batch, one bucket's records and one entry per shard: not a thing per
    row of the release."""
    where = source.where
    seed = settings["shuffle_seed"]
    sample = IdSample() if seed is None else None
    # seeded: the buckets are ranges of the order hash, so only the row count is needed first, exact from the Delta
    # log's file statistics when every file has them (the ids are then checked as they are read)
    counted = source.live_rows() if seed is not None else None
    rows = counted or 0
    if counted is None:
        for batch in source.scan([KEY_COLUMN], batch_rows=65_536):
            if batch.num_rows:
                ids = checked_ids(batch.column(KEY_COLUMN), where=where)
                rows += len(ids)
                if sample is not None:
                    sample.add(ids)
    directory = scope.enter_context(scratch_dir(EXPORT_PREFIX, parent=spill_dir))
    scope.enter_context(_collector_paused())  # until the export's scope closes: its shards are built in it too
    spill = BucketSpill(directory)
    scope.callback(spill.close)  # before the folder goes (LIFO)
    records = RecordSpill(directory)
    buckets: KeyBuckets | None = None
    read = 0
    extensions: tuple[str, ...] | None = None
    with arrow_pool():  # the decoded and encoded batches reuse each other's pages (no fresh page per batch)
        for batch in source.scan(export_columns(source.schema(), where=where)):
            count = batch.num_rows
            if not count:
                continue
            if read + count > rows:
                raise IntegrityError(f"{where}: more rows read than the {rows} counted first; the table "
                                     "version changed underneath? re-run the export")
            ids = checked_ids(batch.column(KEY_COLUMN), where=where) if counted is not None else \
                batch.column(KEY_COLUMN).cast(pa.string())
            data, kinds, member_sizes = member_data(batch)  # spilled without headers and padding
            shard_sizes = _member_spans(member_sizes).sum(axis=1)
            if buckets is None:
                extensions = kinds
                count_buckets = bucket_count(rows, bytes_per_row=int(shard_sizes.sum()) // count,
                                             bucket_bytes=bucket_bytes(settings["shard_size"]),
                                             max_buckets=buckets_allowed(), bucket_rows=bucket_rows)
                buckets = KeyBuckets.by_hash(count_buckets) if sample is None else \
                    KeyBuckets.by_sample(count_buckets, sample)
                spill.open(buckets.count)
            elif kinds != extensions:
                raise IntegrityError(f"{where}: batches of one table version encode different members "
                                     f"({list(kinds)} vs {list(extensions or ())}); re-run the export")
            hashes = order_hash(ids, seed) if seed is not None else None
            bucket = buckets.of(ids, hashes)
            offsets, spilled = spill.add(bucket, data)
            if not np.array_equal(spilled, np.maximum(member_sizes, 0).sum(axis=1)):
                raise IntegrityError(f"{where}: rows spilled other bytes than their members hold; re-run the export")
            columns: dict[str, Any] = {KEY_COLUMN: ids}
            if hashes is not None:
                columns["order_hash"] = pa.array(hashes, pa.uint64())
            # offset: where the row's member data lie in its spill bucket; size: the bytes it takes in a shard
            columns["offset"], columns["size"] = pa.array(offsets, pa.int64()), pa.array(shard_sizes, pa.int64())
            for number in range(len(kinds)):
                columns[f"m{number}"] = pa.array(member_sizes[:, number], pa.int64())
            records.add(bucket, pa.table(columns))
            read += count
    if read != rows:
        raise IntegrityError(f"{where}: {read} rows read, {rows} counted first; re-run the export")
    spill.finish()
    records.flush()
    plan = sort_buckets(records.read, buckets.count if buckets is not None else 0, directory=directory,
                        seeded=seed is not None, extensions=extensions or (), shard_size=settings["shard_size"],
                        shard_samples=settings["shard_samples"], where=where)
    return plan, _LocalRows(spill, plan)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while an export in this process spills and gathers rows: each row
    passes through short-lived buffer views (``BucketSpill.add``/``gather``), which set off a collection every
    700 allocations and a full one every few hundred thousand (~0.3 s of CPU on the 320k rows of the release-scale
    benchmark). The export's own objects are freed by reference counting; the collector runs again afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _writer(plan: BucketPlan, target: Tier, release: str, shuffle_seed: int | None, *,
            journal_dir: str | None) -> ShardWriter:
    return ShardWriter(release=release, router=plan.router(), shuffle_seed=shuffle_seed,
                       starts=tuple(s.start for s in plan.spans), tier_name=target.name, tier_spec=target.spec,
                       tier_source=target.source, journal_dir=journal_dir)


def _write(source: TableSource, writer: ShardWriter, todo: list[int], *, plan: BucketPlan,
           local: _LocalRows | _EngineRuns | None, running: Engine | None, workers: int | None,
           upload_workers: int) -> Iterator[ShardDone]:
    """Write the shards ``todo``, in this process (from ``local``'s spill), from a Ray export's runs, or on an
    engine; yields them as they are published."""
    if not todo:
        return
    if isinstance(local, _EngineRuns):
        assert running is not None, "runs are written by the engine that spilled them"
        writer.start()
        written: list[ShardDone] = []
        groups = ((index, local.slices(index)) for index in todo)  # read as the tasks start
        for done in importlib.import_module("datahub.engines.ray.export").write_slices(
                running, local.runs, groups, key="shard", sink=writer, workers=workers):
            written.append(done)
            yield done
        writer.commit(written)
        return
    if local is not None:
        built = _build_shards(local, writer, todo, buffers=upload_workers + 1)
        yield from _write_shards(built, writer, upload_workers=upload_workers)
        return
    assert running is not None, "an engine export writes on its engine"
    columns = export_columns(source.schema(), where=source.where)
    only = frozenset(todo) if len(todo) < len(writer.starts) else None
    read = RoutedReader(source, tuple(columns), writer, only)
    write_groups = importlib.import_module(f"datahub.engines.{running.name}.export").write_groups
    writer.start()
    options = {"groups": len(writer.starts)} if running.name == "ray" else {}
    yield from writer.commit(write_groups(running, source.files(), read=read, key="shard", sink=writer,
                                          routed_schema=ROUTED, workers=workers, **options))


@dataclass(frozen=True)
class RoutedReader:
    """An engine task's read: one data file of the version, encoded and routed (picklable)."""

    source: TableSource
    columns: tuple[str, ...]
    writer: ShardWriter
    only: frozenset[int] | None

    def __call__(self, file: str) -> Iterator[pa.Table]:
        for batch in self.source.scan(list(self.columns), files=[file]):
            routed = self.writer.encode(batch, only=self.only)
            if routed.num_rows:
                yield routed


@dataclass(frozen=True)
class _Built:
    """One shard's bytes (a view of a reused buffer), built and waiting for upload."""

    index: int
    body: memoryview


def _build_shards(local: _LocalRows, writer: ShardWriter, todo: list[int], *, buffers: int) -> Iterator[_Built]:
    """Shards in order, each gathered from the spill in export order and framed in place (while the previous one
    uploads). ``buffers`` byte buffers are reused in turn: ``_write_shards`` asks for shard k only when shard
    k - ``buffers`` is published, so its buffer is free (no fresh pages per shard). The buffers are anonymous
    mappings, page-aligned, so a cfs tier writes the shards from them with O_DIRECT without a bounce copy
    (``datahub.storage.tier``, ``direct_io``)."""
    spill, plan = local.spill, local.plan
    ring: list[mmap.mmap] = []
    # per turn, the lowest rank a later shard of ``todo`` gathers: the spill's buckets below it are removed once the
    # shard is gathered, so its upload writes into the pages they held (``BucketSpill.release``)
    needed = np.minimum.accumulate([plan.spans[i].start for i in todo][::-1])[::-1].tolist()[1:] + [plan.num_samples]
    released = 0
    for turn, index in enumerate(todo):
        span = plan.spans[index]
        name = shard_name(writer.release, index)
        members = plan.shard_member_bytes(index)
        capacity = members + int(index_reserve(members, span.samples)) + 2 * BLOCK + RECORD
        slot = turn % buffers
        if slot == len(ring):
            ring.append(mmap.mmap(-1, capacity + capacity // 16, flags=mmap.MAP_PRIVATE))
        elif len(ring[slot]) < capacity:  # with room to spare: shards of one size differ by a few KB
            ring[slot] = mmap.mmap(-1, capacity + capacity // 16, flags=mmap.MAP_PRIVATE)
        view = memoryview(ring[slot])
        blocks = np.frombuffer(ring[slot], dtype=np.uint8, count=len(ring[slot]) // BLOCK * BLOCK).reshape(-1, BLOCK)
        keys: list[str] = []
        member_sizes: list[np.ndarray] = []
        place = 0
        for bucket, rows in plan.rows(span.start, span.samples):
            sizes = np.asarray(rows.column("size"), dtype=np.int64)
            places = place + np.cumsum(sizes) - sizes
            if place + int(sizes.sum()) > members:
                raise IntegrityError(f"{name}: the spill holds more bytes than the plan; re-run the export")
            data = np.column_stack([np.asarray(rows.column(f"m{n}"), dtype=np.int64)
                                    for n in range(len(plan.extensions))]) \
                if plan.extensions else np.zeros((rows.num_rows, 0), dtype=np.int64)
            _frame_rows(spill, bucket, np.asarray(rows.column("offset"), dtype=np.int64), data, sizes, places,
                        rows.column(KEY_COLUMN), plan.extensions, view, blocks, where=name)
            place += int(sizes.sum())
            keys.extend(rows.column(KEY_COLUMN).to_pylist())
            member_sizes.append(data)
        if place != members:
            raise IntegrityError(f"{name}: the spill gave back fewer bytes than the plan holds; re-run the export")
        while released < plan.buckets and plan.bucket_starts[released + 1] <= needed[turn]:
            spill.release(released)
            released += 1
        # the same bytes as ``write.shard_body``: members, the __index__ member, the end blocks
        sizes_matrix = np.concatenate(member_sizes) if member_sizes else np.zeros((0, len(plan.extensions)), np.int64)
        embedded = index_member(_listing(plan.extensions, sizes_matrix, keys), members)
        end = members + len(embedded)
        view[members:end] = embedded
        closing = end_of_archive(end)
        view[end:end + len(closing)] = closing
        yield _Built(index, view[:end + len(closing)])
        del view, blocks


def _member_spans(sizes: np.ndarray) -> np.ndarray:
    """Bytes each member takes in a shard (rows x extensions; data bytes in, -1 for no member): its header, data
    and padding to the next block, 0 for no member."""
    data = np.maximum(sizes, 0)
    return np.where(sizes >= 0, BLOCK + data + (-data % BLOCK), 0)


def _frame_rows(spill: BucketSpill, bucket: int, offsets: np.ndarray, sizes: np.ndarray, row_bytes: np.ndarray,
                places: np.ndarray, keys: pa.ChunkedArray | pa.Array, extensions: tuple[str, ...], view: memoryview,
                blocks: np.ndarray, *, where: str) -> None:
    """Rows of one spill bucket into a shard's buffer as tar members: each member's data (spilled back to back
    without headers, from the row's ``offsets``; ``sizes``: rows x extensions, -1 for no member) read to its place,
    its header (``header_blocks``) and its zero padding written by 512-byte block (``blocks``: the buffer by block;
    every member starts at a block boundary, ``places`` are the rows' places in the shard). The same bytes as the
    rows' ``encoded_members``; every byte of the rows' span is written (the buffer is reused)."""
    spans = _member_spans(sizes)
    if not np.array_equal(spans.sum(axis=1), row_bytes):
        raise IntegrityError(f"{where}: the plan's member sizes do not add up to its rows' sizes; re-run the export")
    data = np.maximum(sizes, 0)
    heads = places[:, None] + np.cumsum(spans, axis=1) - spans  # each member's header, in the shard
    sources = offsets[:, None] + np.cumsum(data, axis=1) - data  # its data, in the bucket's file
    padded = (sizes > 0) & (data % BLOCK != 0)
    blocks[(heads[padded] + BLOCK + data[padded]) // BLOCK] = 0  # the last data block: zeros past the data
    for column, extension in enumerate(extensions):
        present = sizes[:, column] >= 0
        if not present.any():
            continue
        chosen = keys if present.all() else keys.filter(pa.array(present))
        names = pc.binary_join_element_wise(chosen, pa.scalar(f".{extension}"), "")
        blocks[heads[present, column] // BLOCK] = header_blocks(names, data[present, column])
    present = sizes >= 0
    spill.gather(bucket, sources[present], data[present], heads[present] + BLOCK, view)


def _write_shards(built: Iterator[_Built], writer: ShardWriter, *, upload_workers: int = 1) -> Iterator[ShardDone]:
    """Build shard N+1 while shard N uploads; yield finished shards in order.

    At most ``upload_workers`` uploads run at once and one more shard waits built, so memory stays
    at about ``(upload_workers + 2) * shard_size``. A failed upload raises here after the shards
    before it were journalled (the journal entry is written after each upload); a journal entry past a
    gap is ignored by ``_Journal.verified``, so a re-run uploads from the first unjournalled shard (same bytes).
    """
    tier = writer.tier()
    with hashing_thread() as hasher, \
            ThreadPoolExecutor(max_workers=upload_workers, thread_name_prefix="datahub-export-upload") as pool:
        pending: deque[Future[ShardDone]] = deque()
        try:
            for shard in built:
                pending.append(pool.submit(writer.publish, shard.index, shard.body, tier=tier, hasher=hasher))
                del shard  # the future holds the bytes until uploaded
                while len(pending) > upload_workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _repair(existing: Manifest, target: Tier, source: TableSource, settings: dict[str, Any], *,
            engine: EngineChoice, workers: int | None, verify: bool, spill_dir: str | None, upload_workers: int,
            report: Progress, bucket_rows: int | None = None) -> list[str]:
    """Rewrite the shards whose replica on ``target`` is missing or damaged (size; sha256 with ``verify``)."""
    damaged = [i for i, shard in enumerate(existing.shards)
               if not _intact(target, target.uri(existing.release, shard.name), shard.size, shard.checksum, verify=verify)]
    if not damaged:
        return []
    names = [existing.shards[i].name for i in damaged]
    log.warning("tier %s: %d damaged or missing shard(s) of %s, rewriting: %s", target.name, len(damaged),
                existing.release, ", ".join(names))
    report("repair", 0, len(damaged))
    with ExitStack() as scope:
        running = engine_in_scope(engine, scope, purpose="export")
        plan, local = _plan_pass(source, settings, running=running, spill_dir=spill_dir, scope=scope,
                                 workers=workers, bucket_rows=bucket_rows)
        if [s.samples for s in plan.spans] != [s.samples for s in existing.shards]:
            raise IntegrityError(f"release {existing.release!r}: {source.where} no longer plans the published shards; "
                                 "copy an intact replica with `datahub tier apply` instead")
        writer = _writer(plan, target, existing.release, settings["shuffle_seed"], journal_dir=None)
        for count, shard in enumerate(_write(source, writer, damaged, plan=plan, local=local, running=running,
                                             workers=workers, upload_workers=upload_workers), 1):
            if shard.sha256 != existing.shards[shard.index].sha256:
                raise IntegrityError(f"{shard.name}: the rewritten shard differs from the manifest (sha256 "
                                     f"{shard.sha256[:12]} vs {str(existing.shards[shard.index].sha256)[:12]}); copy an "
                                     "intact replica with `datahub tier apply` instead")
            report("repair", count, len(damaged))
    return names


def _intact(tier: Tier, uri: str, size: int, sha256: str, *, verify: bool) -> bool:
    if tier.size(uri) != size:
        return False
    return not verify or tier.verify(uri, size=size, sha256=sha256)


WITHDRAWN_KEY = "withdrawn"  # in a manifest's JSON: {"reason": ..., "at": ISO time} (``datahub tier remove``)


def read_withdrawal(lake: Lake, release: str) -> dict[str, Any] | None:
    """The withdrawal mark of ``release``'s lake manifest (``datahub tier remove``), or None (not withdrawn, or no
    export). Read from the raw JSON: the ``Manifest`` model does not carry it, so a mark is never dropped by it."""
    import fsspec

    uri = lake_manifest_uri(lake, release)
    fs, path = fsspec.core.url_to_fs(uri, **fsspec_options(lake.storage_options))
    try:
        data = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None
    mark = data.get(WITHDRAWN_KEY) if isinstance(data, dict) else None
    return dict(mark) if isinstance(mark, dict) else None


def publish_manifest(lake: Lake, manifest: Manifest, *, storage: StorageConfig | None,
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


class _Journal:
    """Per-shard completion records, so a re-run skips verified shards without rebuilding them."""

    def __init__(self, tier: Tier, release: str, export_key: str) -> None:
        self.tier = tier
        self.release = release
        self.dir = tier.uri(release, "_partial", export_key)

    def _entry(self, index: int) -> str:
        return f"{self.dir}/{index:06d}.json"

    def verified(self) -> list[ShardDone]:
        """Journalled shards from the first on, each verified at the destination (size, sha256)."""
        done: list[ShardDone] = []
        while True:
            try:
                entry = ShardDone(**json.loads(self.tier.read(self._entry(len(done)))))
            except FileNotFoundError:
                return done
            uri = self.tier.uri(self.release, entry.name)
            if not self.tier.verify(uri, size=entry.size, sha256=entry.sha256):
                return done  # rebuild from this shard on
            done.append(entry)

    def clear(self) -> None:
        """Drop the journals of this release (any export key: only the published one matters now),
        and the temp file of a shard whose upload a killed export left behind: not one still being written (nothing
        stops another export or a tier apply of this release and tier from running meanwhile)."""
        self.tier.delete(self.dir.rsplit("/", 1)[0], recursive=True)
        self.tier.sweep_partials(self.tier.uri(self.release), older_than=STALE_PARTIAL_S)


def commit_export_lineage(lake: Lake, release: str, tier: Tier, shards: list[ShardDone],
                          ids_of: Callable[[ShardDone], pa.Array], export_key: str) -> None:
    """The shard index as ``exported`` lineage events, one commit (txn ``export/{release}/{tier}``), streamed
    shard by shard (``ids_of`` gives a shard's sample ids in shard order)."""
    commit_shard_index(lake, release, tier, ((shard.name, ids_of(shard)) for shard in shards), op=EXPORT_OP,
                       params_hash=export_key)


def _content_digest(id_chunks: Iterable[pa.Array], table: str, version: int) -> str:
    """Stand-in for a release digest when exporting a bare table version: table, version and ids in order
    (sha256 of the lines, fed in slices)."""
    digest = hashlib.sha256(f"{table}@{version}".encode())
    for ids in id_chunks:
        for start in range(0, len(ids), 65_536):
            chunk = ids.slice(start, 65_536).to_pylist()
            if chunk:
                digest.update(("\n" + "\n".join(chunk)).encode())
    return digest.hexdigest()

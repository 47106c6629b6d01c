"""Writing planned shards: rows are encoded and routed to their shard, a shard's rows are ordered and framed.

The same two steps run in one process (``datahub.export.spill`` groups the routed rows on local disk) and in
engine tasks (``datahub.engines.ray.export`` / ``spark.export`` group them in a shuffle): a shard's bytes depend
only on its rows, so every way of running gives the same shards.

Routed rows: ``shard`` (int64), ``order_hash`` (the uint64 order hash stored as int64 bits; 0 without a seed),
``sample_id`` and ``members`` (the row's tar members, large_binary).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.engines.sink import Sink
from datahub.errors import IntegrityError
from datahub.export.plan import ShardRouter, order_hash
from datahub.export.samples import KEY_COLUMN, encode_tar
from datahub.shards.tar import end_of_archive
from datahub.shards.index import index_member, index_rows, index_tar
from datahub.storage.tier import Tier

ROUTED = pa.schema([("shard", pa.int64()), ("order_hash", pa.int64()), (KEY_COLUMN, pa.string()),
                    ("members", pa.large_binary())])


def shard_name(release: str, index: int) -> str:
    return f"{release}-{index:06d}.tar"


@dataclass(frozen=True)
class ShardDone:
    """One published shard: what the manifest, the journal and the lineage need (a small task result)."""

    index: int
    name: str
    size: int
    sha256: str
    samples: int
    start: int
    end: int

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def shard_body(members: pa.Buffer | bytes, *, where: str, row_offsets: np.ndarray | None = None,
               keys: list[str] | None = None) -> bytes:
    """A whole shard file from its members back to back: the members, the ``__index__`` member, end blocks
    (``row_offsets``/``keys``: where each row's members begin and its key, so the index is built row-wise)."""
    listing = (index_rows(memoryview(members), row_offsets, keys, where=where)
               if row_offsets is not None and keys is not None else index_tar(memoryview(members), where=where))
    embedded = index_member(listing, len(members))
    return b"".join([memoryview(members), embedded, end_of_archive(len(members) + len(embedded))])


@dataclass(frozen=True)
class ShardWriter(Sink[ShardDone, list[ShardDone]]):
    """The export's sink on the write seam (``datahub.engines.sink``): a task's ``write`` gets every routed row
    of one shard, builds and publishes it and returns its ``ShardDone``; ``commit`` orders the results (the
    manifest is published by the export after the lineage). Picklable: the routing keys, the tier by spec,
    the release and the journal dir. No ``abort``: published shards stay, journalled, for a re-run to keep."""

    release: str
    router: ShardRouter
    shuffle_seed: int | None
    starts: tuple[int, ...]
    tier_name: str
    tier_spec: Any
    tier_source: str
    journal_dir: str | None = None

    def tier(self) -> Tier:
        return Tier(self.tier_name, self.tier_spec, source=self.tier_source)

    def encode(self, batch: pa.RecordBatch | pa.Table, *, only: frozenset[int] | None = None) -> pa.Table:
        """Routed rows of ``batch`` (export columns): tar members per row and the shard they belong to."""
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        ids = table[KEY_COLUMN].combine_chunks().cast(pa.string())
        hashes = order_hash(ids, self.shuffle_seed) if self.shuffle_seed is not None else None
        shards = self.router.route(ids, hashes)
        if only is not None:
            keep = np.isin(shards, np.fromiter(only, dtype=np.int64, count=len(only)))
            if not keep.all():
                mask = pa.array(keep)
                table, ids, shards = table.filter(mask), ids.filter(mask), shards[keep]
                hashes = hashes[keep] if hashes is not None else None
        members = pa.concat_arrays(list(encode_tar(table))) if table.num_rows else pa.array([], pa.large_binary())
        bits = hashes.view(np.int64) if hashes is not None else np.zeros(len(ids), dtype=np.int64)
        return pa.table([pa.array(shards, pa.int64()), pa.array(bits, pa.int64()), ids, members], schema=ROUTED)

    def build(self, rows: pa.Table) -> tuple[int, bytes]:
        """The shard file of one shard's routed rows (any order in, export order out)."""
        index = int(rows["shard"][0].as_py())
        if pc.any(pc.not_equal(rows["shard"], index)).as_py():
            raise IntegrityError(f"{shard_name(self.release, index)}: rows of several shards given to one writer")
        if rows.num_rows != self.router.samples[index]:
            raise IntegrityError(f"{shard_name(self.release, index)}: {rows.num_rows} rows routed, the plan has "
                                 f"{self.router.samples[index]}; the table version changed underneath? re-run the export")
        if self.shuffle_seed is not None:
            hashes = np.asarray(rows["order_hash"].combine_chunks(), dtype=np.int64).view(np.uint64)
            keyed = pa.table({"h": hashes, "id": rows[KEY_COLUMN]})
            order = pc.sort_indices(keyed, sort_keys=[("h", "ascending"), ("id", "ascending")])
        else:
            order = pc.sort_indices(rows[KEY_COLUMN])
        members = rows["members"].take(order).combine_chunks()
        offsets = np.frombuffer(members.buffers()[1], dtype=np.int64)[members.offset:members.offset + len(members) + 1]
        data = members.buffers()[2]
        begin, end = int(offsets[0]), int(offsets[-1])
        keys = rows[KEY_COLUMN].take(order).to_pylist()
        body = shard_body(data.slice(begin, end - begin) if data is not None else b"", where=shard_name(self.release, index),
                          row_offsets=offsets - begin, keys=keys)
        return index, body

    def publish(self, index: int, body: bytes | memoryview, *, tier: Tier | None = None,
                hasher: Executor | None = None) -> ShardDone:
        """Hash the bytes, publish them, check the size the tier reports, journal the shard (``body``: a view of a
        reused buffer from a local export, written as it is to a cfs tier). ``hasher``: the export's hashing thread
        (``hashing_thread``); without one, a thread of its own for this shard."""
        target = tier or self.tier()
        name = shard_name(self.release, index)
        uri = target.uri(self.release, name)
        with ExitStack() as scope:
            if hasher is None:
                hasher = scope.enter_context(hashing_thread())
            # hashed on a helper thread while the tier writes (hashlib releases the GIL): a cfs tier's O_DIRECT write
            # waits for the device, a ceph PUT for the network, and the hash fills that wait
            hashed = hasher.submit(_sha256, body)
            # a cfs tier writes any buffer (a file write): the view goes as it is, without a copy
            target.publish(uri, cast(bytes, body) if target.kind == "cfs" else bytes(body))
            digest = hashed.result()
        if target.size(uri) != len(body):
            raise IntegrityError(f"tier {target.name}: {uri} has the wrong size after writing; check the tier and re-run")
        start = self.starts[index]
        done = ShardDone(index, name, len(body), digest, self.router.samples[index], start,
                         start + self.router.samples[index])
        if self.journal_dir is not None:
            target.publish(f"{self.journal_dir}/{index:06d}.json", json.dumps(done.as_row()).encode())
        return done

    def write(self, batches: Iterable[pa.Table]) -> ShardDone:
        """Build and publish the shard of these rows (all rows of one shard)."""
        index, body = self.build(pa.concat_tables(list(batches)))
        return self.publish(index, body)

    def commit(self, results: list[ShardDone]) -> list[ShardDone]:
        return sorted(results, key=lambda done: done.index)


def hashing_thread() -> ThreadPoolExecutor:
    """One thread that hashes shards while they are written (``ShardWriter.publish``): an export's uploads share it
    (sha256 runs at ~2 GB/s a core here, above a disk's or a network's write speed), so no thread starts per shard."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="datahub-export-sha256")


def _sha256(body: bytes | memoryview) -> str:
    return hashlib.sha256(body).hexdigest()

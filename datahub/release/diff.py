"""``release.diff``: which samples a release added or removed relative to another, per source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.release.records import Release, get_release


ID_BATCH_ROWS = 8192


@dataclass(frozen=True)
class ReleaseDiff:
    """Counts of distinct sample ids; ``added`` = in ``new`` not in ``old``."""

    old: str
    new: str
    added: int
    removed: int
    unchanged: int
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)  # source_uri -> {added, removed}
    added_ids: list[str] | None = None
    removed_ids: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.added_ids is None:
            out.pop("added_ids")
            out.pop("removed_ids")
        return out


def _narrow(lake: Lake, release: Release) -> pa.Table:
    """The release's sample_id and source_uri (null when it has none), scanned in bounded batches."""
    dataset = lake.dataset(release.table, release.version)
    has_source = "source_uri" in dataset.schema.names
    schema = pa.schema([("sample_id", pa.string()), ("source_uri", pa.string())])
    parts = []
    for batch in scan_batches(dataset, columns=["sample_id", "source_uri"] if has_source else ["sample_id"],
                              batch_rows=ID_BATCH_ROWS):
        source = batch.column("source_uri") if has_source else pa.nulls(batch.num_rows, pa.string())
        parts.append(pa.table([batch.column("sample_id").cast(pa.string()), source.cast(pa.string())], schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _distinct(rows: pa.Table) -> pa.Table:
    """One row per sample_id (the first source it was seen in)."""
    grouped = rows.group_by("sample_id", use_threads=False).aggregate([("source_uri", "first")])
    return pa.table({"sample_id": grouped.column("sample_id"), "source_uri": grouped.column("source_uri_first")})


def _per_source(rows: pa.Table) -> dict[str, int]:
    if not rows.num_rows:
        return {}
    counts = rows.group_by("source_uri").aggregate([("sample_id", "count")])
    return dict(zip(counts.column("source_uri").to_pylist(), counts.column("sample_id_count").to_pylist()))


def diff_releases(lake: Lake, old: str, new: str, *, with_ids: bool = False) -> ReleaseDiff:
    """Compare release ``old`` to release ``new`` (sample ids overall and per source_uri)."""
    a = _distinct(_narrow(lake, get_release(lake, old)))
    b = _distinct(_narrow(lake, get_release(lake, new)))
    in_a = pc.is_in(b.column("sample_id"), value_set=a.column("sample_id").combine_chunks())
    in_b = pc.is_in(a.column("sample_id"), value_set=b.column("sample_id").combine_chunks())
    added = b.filter(pc.invert(in_a))
    removed = a.filter(pc.invert(in_b))
    by_source: dict[str, dict[str, int]] = {}
    for kind, rows in (("added", added), ("removed", removed)):
        for source, count in _per_source(rows).items():
            by_source.setdefault(source or "<unknown>", {"added": 0, "removed": 0})[kind] = int(count)
    return ReleaseDiff(
        old=old,
        new=new,
        added=added.num_rows,
        removed=removed.num_rows,
        unchanged=int(pc.sum(pc.cast(in_a, pa.int64())).as_py() or 0),
        by_source=dict(sorted(by_source.items())),
        added_ids=sorted(added.column("sample_id").to_pylist()) if with_ids else None,
        removed_ids=sorted(removed.column("sample_id").to_pylist()) if with_ids else None,
    )

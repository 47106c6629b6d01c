"""``release.diff``: which samples a release added or removed relative to another, per source."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.progress import Progress, counted
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


_ID_ROWS = pa.schema([("sample_id", pa.string()), ("source_code", pa.int32())])


def _sort_ids(lake: Lake, release: Release, runs: SortedRuns, sources: dict[str | None, int],
              progress: Progress | None = None) -> None:
    """Add the release's (sample_id, code of its source_uri) rows to ``runs``, which keeps each id's first row: its
    first source in scan order. ``sources``: source_uri (None when the table has none) -> code, filled here."""
    dataset = lake.dataset(release.table, release.version)
    has_source = "source_uri" in dataset.schema.names
    batches = scan_batches(dataset, columns=["sample_id", "source_uri"] if has_source else ["sample_id"],
                           batch_rows=ID_BATCH_ROWS)
    for batch in counted(batches, progress, f"read {release.name}", total=release.row_count,
                         rows=lambda batch: batch.num_rows):
        ids = batch.column("sample_id").cast(pa.string())
        valid = pc.is_valid(ids)  # sample_id is never null in a lake table; a null one is no sample to compare
        source = (batch.column("source_uri").cast(pa.string()) if has_source
                  else pa.nulls(batch.num_rows, pa.string())).filter(valid)
        encoded = pc.dictionary_encode(source)
        remap = pa.array([sources.setdefault(v, len(sources)) for v in encoded.dictionary.to_pylist()], pa.int32())
        codes = remap.take(encoded.indices) if len(remap) else pa.nulls(len(encoded), pa.int32())
        codes = pc.fill_null(codes, sources.setdefault(None, len(sources)))
        runs.add(pa.table([ids.filter(valid), codes], schema=_ID_ROWS))


def _aligned(old: Iterator[pa.Table], new: Iterator[pa.Table]) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Blocks of two sorted distinct id streams, paired so that each pair covers the same range of ids."""
    empty = _ID_ROWS.empty_table()
    a, b = next(old, None), next(new, None)
    while a is not None and b is not None:
        a_last, b_last = a.column("sample_id")[-1], b.column("sample_id")[-1]
        bound = a_last if a_last.as_py() <= b_last.as_py() else b_last
        a_count = int(pc.sum(pc.less_equal(a.column("sample_id"), bound)).as_py() or 0)
        b_count = int(pc.sum(pc.less_equal(b.column("sample_id"), bound)).as_py() or 0)
        yield a.slice(0, a_count), b.slice(0, b_count)
        a, b = a.slice(a_count), b.slice(b_count)
        if not a.num_rows:
            a = next(old, None)
        if not b.num_rows:
            b = next(new, None)
    while a is not None:  # the other stream is done: the rest is one-sided
        yield a, empty
        a = next(old, None)
    while b is not None:
        yield empty, b
        b = next(new, None)


def _count_codes(counts: dict[int, int], codes: pa.ChunkedArray) -> None:
    if len(codes):
        tally = pc.value_counts(codes)
        for code, count in zip(tally.field("values").to_pylist(), tally.field("counts").to_pylist()):
            counts[code] = counts.get(code, 0) + count


def diff_releases(lake: Lake, old: str, new: str, *, with_ids: bool = False,
                  progress: Progress | None = None) -> ReleaseDiff:
    """Compare release ``old`` to release ``new`` (sample ids overall and per source_uri).

    Each release's distinct ids (with their first source) are sorted in runs spilled to local disk
    (``datahub.lake.external_sort``) and the two sorted streams are merged, so memory stays bounded whatever the
    releases' sizes (the ids of ``with_ids`` excepted). ``progress(stage, done, total)`` gets the rows read of
    each release (``read OLD``, ``read NEW``) and the distinct ids compared (``compare``)."""
    old_release, new_release = get_release(lake, old), get_release(lake, new)
    sources: dict[str | None, int] = {}
    added = removed = unchanged = 0
    added_by: dict[int, int] = {}
    removed_by: dict[int, int] = {}
    added_ids: list[str] = []
    removed_ids: list[str] = []
    with SortedRuns(_ID_ROWS, "sample_id") as old_ids, SortedRuns(_ID_ROWS, "sample_id") as new_ids:
        _sort_ids(lake, old_release, old_ids, sources, progress)
        _sort_ids(lake, new_release, new_ids, sources, progress)
        pairs = counted(_aligned(old_ids.merged(), new_ids.merged()), progress, "compare", total=None,
                        rows=lambda pair: pair[0].num_rows + pair[1].num_rows)
        for a, b in pairs:
            in_a = pc.is_in(b.column("sample_id"), value_set=a.column("sample_id").combine_chunks())
            in_b = pc.is_in(a.column("sample_id"), value_set=b.column("sample_id").combine_chunks())
            gained, lost = b.filter(pc.invert(in_a)), a.filter(pc.invert(in_b))
            added += gained.num_rows
            removed += lost.num_rows
            unchanged += int(pc.sum(pc.cast(in_a, pa.int64())).as_py() or 0)
            _count_codes(added_by, gained.column("source_code"))
            _count_codes(removed_by, lost.column("source_code"))
            if with_ids:
                added_ids.extend(gained.column("sample_id").to_pylist())
                removed_ids.extend(lost.column("sample_id").to_pylist())
    names = {code: source for source, code in sources.items()}
    by_source: dict[str, dict[str, int]] = {}
    for kind, counts in (("added", added_by), ("removed", removed_by)):
        for code, count in counts.items():
            by_source.setdefault(names[code] or "<unknown>", {"added": 0, "removed": 0})[kind] += count
    return ReleaseDiff(
        old=old,
        new=new,
        added=added,
        removed=removed,
        unchanged=unchanged,
        by_source=dict(sorted(by_source.items())),
        added_ids=added_ids if with_ids else None,
        removed_ids=removed_ids if with_ids else None,
    )

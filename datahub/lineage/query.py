"""Lineage lookups: the whole story of one sample, or what became of every record of one file.

One-sample lookups are a point query on ``lineage``: Delta file statistics prune files whose
sample_id min/max excludes the id (``file_pruning_predicate``) and Parquet row-group
statistics prune inside the rest; the pipeline and releases write each commit sorted by
sample_id, and ``datahub lineage optimize`` Z-orders older files so the pruning stays tight.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.lake.timestamps import iso_utc
from datahub.progress import Progress, counted

LINEAGE_TABLE = "lineage"
SCAN_ROWS = 16_384  # rows per batch of a scan over the whole lineage table (a --source lookup)
# Order of actions inside one run (events of one run share a timestamp).
_ACTION_ORDER = {"ingested": 0, "modified": 1, "annotated": 2, "quarantined": 3, "dropped": 4, "released": 5, "exported": 6}


def lineage_events(lake: Lake, sample_ids: str | list[str]) -> pa.Table:
    """Every lineage row of one sample id (or several), in time order."""
    ids = [sample_ids] if isinstance(sample_ids, str) else list(sample_ids)
    if not ids or not lake.exists(LINEAGE_TABLE):
        from datahub.lake.tables import LINEAGE

        return LINEAGE.empty_table()
    pruning: list[tuple[str, str, Any]]
    if len(ids) == 1:
        pruning = [("sample_id", "=", ids[0])]
    else:
        pruning = [("sample_id", "in", ids)]
    dataset = lake.dataset(LINEAGE_TABLE, file_pruning_predicate=pruning)
    # files and row groups whose sample_id statistics exclude the ids are skipped; the rest is read a batch at a time
    # without read-ahead and filtered at once: the dataset scanner (even with fragment and batch readahead 1) held
    # 11-20 MB of decoded row groups of every column depending on thread timing, 2-4 MB over what the story of a
    # small file may hold (tests/lineage/test_source_memory.py)
    rows = pa.Table.from_batches(list(scan_batches(dataset, values_in=("sample_id", ids))),
                                 schema=pa.schema(dataset.schema))
    rank = pa.array([_ACTION_ORDER.get(a, 9) for a in rows.column("action").to_pylist()], pa.int8())
    step = pa.array(_graph_steps(lake, rows), pa.int32())
    rows = rows.append_column("_rank", rank).append_column("_step", step)
    return rows.sort_by([("ts", "ascending"), ("_step", "ascending"), ("_rank", "ascending")]).drop_columns(
        ["_rank", "_step"])


def _graph_steps(lake: Lake, rows: pa.Table) -> list[int]:
    """Each event's place in its run: ingest first, then the run's operators in graph order (``runs.operators``),
    then releases and exports; events of one run share a timestamp, so this orders them as they happened."""
    actions = rows.column("action").to_pylist()
    run_ids = rows.column("run_id").to_pylist()
    ops = rows.column("op").to_pylist()
    order: dict[str, dict[str, int]] = {}
    wanted = sorted({r for r in run_ids if r is not None and not r.startswith(("release/", "export/"))})
    if wanted and lake.exists("runs"):
        runs = lake.read("runs", columns=["run_id", "operators"], filters=ds.field("run_id").isin(wanted))
        for run_id, operators in zip(runs.column("run_id").to_pylist(), runs.column("operators").to_pylist()):
            order[run_id] = {op: i for i, op in enumerate(operators or [])}
    steps = []
    for action, run_id, op in zip(actions, run_ids, ops):
        if action == "ingested":
            steps.append(-1)
        else:
            steps.append(order.get(run_id or "", {}).get(op or "", 1 << 20))  # unknown: after the run's operators
    return steps


def _ref(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # released rows carry the plain release name


@dataclass(frozen=True)
class SampleStory:
    sample_id: str
    fate: str  # kept | dropped | quarantined | redacted | unknown
    origins: list[dict[str, Any]] = field(default_factory=list)  # source_uri, source_offset, run_id
    events: list[dict[str, Any]] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    exports: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _pipeline_events(sample_id: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pipeline's events about the sample itself: not a release's, and not the drop of another copy of it (a
    drop whose dup_of is this very id dropped another record with the same content, a second copy in the inputs
    or a page seen again by a later run: the sample itself lives on in the kept record)."""
    return [e for e in events if not (e["run_id"] or "").startswith("release/")
            and not (isinstance(e["ref"], dict) and e["ref"].get("dup_of") == sample_id)]


def _fate(sample_id: str, events: list[dict[str, Any]]) -> str:
    if not events:
        return "unknown"
    pipeline = _pipeline_events(sample_id, events)
    if any(e["action"] == "quarantined" for e in pipeline):
        return "quarantined"
    if any(e["action"] == "dropped" for e in pipeline):
        return "dropped"
    if any(e["action"] == "dropped" and (e["op"] or "").startswith("release.redact") for e in events):
        return "redacted"
    return "kept"


def story_from_events(sample_id: str, rows: list[dict[str, Any]]) -> SampleStory:
    events = []
    for row in rows:
        event = {k: row[k] for k in ("action", "op", "params_hash", "reason", "run_id")}
        event["ts"] = iso_utc(row["ts"])  # the 'Z' form of every --json date-time
        event["ref"] = _ref(row["ref"])
        events.append(event)
    origins = [
        {**(e["ref"] if isinstance(e["ref"], dict) else {}), "run_id": e["run_id"]} for e in events if e["action"] == "ingested"
    ]
    releases = list(dict.fromkeys(e["ref"] for e in events if e["action"] == "released"))
    exports = [e["ref"] for e in events if e["action"] == "exported"]
    return SampleStory(sample_id, _fate(sample_id, events), origins, events, releases, exports)


def sample_lineage(lake: Lake, sample_id: str) -> SampleStory:
    """Origin, every operator that changed or annotated it, drops with reasons, releases, exports."""
    return story_from_events(sample_id, lineage_events(lake, sample_id).to_pylist())


@dataclass(frozen=True)
class SourceStory:
    source_uri: str
    # one per sample of a record (source_offset): sample_id, fate, reason, op, ref, releases; a record that became
    # several samples (a trajectory's segments) has one entry per segment, in step order (step_offset); a record that
    # never got a sample id (quarantined at ingest) has one entry without one
    records: list[dict[str, Any]]
    counts: dict[str, int]  # entries by fate
    record_count: int = 0  # distinct records (offsets) of the file

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _step_offsets(lake: Lake, sample_ids: list[str]) -> dict[str, int]:
    """``step_offset`` of the given samples (segments of one record), for listing them in step order."""
    if not sample_ids or not lake.exists("samples"):
        return {}
    dataset = lake.dataset("samples")
    if "step_offset" not in dataset.schema.names:
        return {}
    rows = dataset.to_table(columns=["sample_id", "step_offset"], filter=ds.field("sample_id").isin(sample_ids))
    return {i: o for i, o in zip(rows.column("sample_id").to_pylist(), rows.column("step_offset").to_pylist())
            if o is not None}


def source_lineage(lake: Lake, source_uri: str, *, progress: Progress | None = None) -> SourceStory:
    """What became of every record of one input file: kept, dropped (why), quarantined.

    Records that never got a sample_id (unparseable) come from the ``quarantine`` table.
    Two records of one file with the same text share a sample_id, so they share a fate.
    ``progress(stage, done, None)`` gets the rows of the lake's lineage events scanned so far.
    """
    records: dict[tuple[int, str | None], dict[str, Any]] = {}
    if lake.exists(LINEAGE_TABLE):
        needle = json.dumps(source_uri)
        # streamed: the lake's events are read a batch at a time, row group by row group with no read-ahead
        # (the dataset scanner held several decoded row groups, whatever its readahead said), and only this file's
        # ingested events are kept
        batches = counted(scan_batches(lake.dataset(LINEAGE_TABLE), columns=["action", "sample_id", "ref", "run_id"],
                                       batch_rows=SCAN_ROWS), progress, "lineage events scanned", total=None, rows=len)
        matched = (batch.filter(pc.and_(pc.equal(batch.column("action"), "ingested"),
                                        pc.match_substring(batch.column("ref"), needle))) for batch in batches)
        for row in (row for batch in matched for row in batch.to_pylist()):
            ref = _ref(row["ref"])
            if isinstance(ref, dict) and ref.get("source_uri") == source_uri:
                offset = int(ref["source_offset"])
                records[(offset, row["sample_id"])] = {"source_offset": offset, "sample_id": row["sample_id"],
                                                       "ingest_run_id": row["run_id"]}
        ids = sorted({r["sample_id"] for r in records.values()})
        events = lineage_events(lake, ids).to_pylist() if ids else []
        by_id: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            by_id.setdefault(event["sample_id"], []).append(event)
        for record in records.values():
            story = story_from_events(record["sample_id"], by_id.get(record["sample_id"], []))
            # the drop that decided the fate (the one _fate counts), else a release's take-down
            deciding = _pipeline_events(record["sample_id"], story.events) if story.fate != "redacted" else story.events
            last_drop = next((e for e in reversed(deciding) if e["action"] in ("dropped", "quarantined")), None)
            record.update(fate=story.fate, releases=story.releases,
                          reason=last_drop["reason"] if last_drop and story.fate != "kept" else None,
                          op=last_drop["op"] if last_drop and story.fate != "kept" else None,
                          ref=last_drop["ref"] if last_drop and story.fate != "kept" else None)
        per_offset: dict[int, int] = {}
        for offset, _ in records:
            per_offset[offset] = per_offset.get(offset, 0) + 1
        steps = _step_offsets(lake, sorted(i for (o, i) in records if i is not None and per_offset[o] > 1))
        for (_, sample_id), record in records.items():
            if sample_id in steps:
                record["step_offset"] = steps[sample_id]
    if lake.exists("quarantine"):
        bad = lake.read("quarantine", columns=["source_offset", "reason", "detail", "run_id"],
                        filters=ds.field("source_uri") == source_uri)
        by_offset: dict[int, list[dict[str, Any]]] = {}
        for (offset, _), record in records.items():
            by_offset.setdefault(offset, []).append(record)
        for row in bad.to_pylist():
            offset = int(row["source_offset"])
            if offset not in by_offset:
                by_offset[offset] = [records.setdefault((offset, None), {
                    "source_offset": offset, "sample_id": None, "releases": [], "op": None, "ref": None,
                    "ingest_run_id": row["run_id"]})]
            for record in by_offset[offset]:
                record.update(fate="quarantined", reason=row["reason"], detail=row["detail"])
    ordered = [records[k] for k in sorted(records, key=lambda k: (k[0], records[k].get("step_offset", -1),
                                                                  k[1] or ""))]
    counts: dict[str, int] = {}
    for record in ordered:
        counts[record["fate"]] = counts.get(record["fate"], 0) + 1
    return SourceStory(source_uri, ordered, dict(sorted(counts.items())), record_count=len({k[0] for k in records}))

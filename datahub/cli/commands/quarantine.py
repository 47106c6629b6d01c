"""`datahub quarantine --lake LAKE`: what was quarantined and why, counted by reason with examples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, plain, print_json, progress

EXAMPLE_COLUMNS = ["source_uri", "source_offset", "detail", "run_id", "raw", "raw_size"]
PREVIEW_BYTES = 80  # of the record's first bytes (the table keeps a few hundred)


def _preview(raw: bytes | None) -> str | None:
    """The record's first bytes as one line of text: UTF-8 where it is, \\xNN escapes where not, \\n for newlines."""
    if raw is None:
        return None
    binary = any(b < 9 for b in raw[:PREVIEW_BYTES])  # an image's header, not a text record: its magic suffices
    text = raw[:16 if binary else PREVIEW_BYTES].decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


SCAN_ROWS = 65_536  # rows of (reason, source_uri, source_offset) per batch of the counting pass
RAW_SCAN_ROWS = 1_024  # rows per batch of the examples' pass, which reads `raw` (up to 4 KB a row)


def _scan(lake: Any, columns: list[str], where: Any, batch_size: int = SCAN_ROWS) -> Any:
    return lake.dataset("quarantine").scanner(columns=columns, filter=where, batch_size=batch_size,
                                              fragment_readahead=1, batch_readahead=1).to_batches()


def quarantine_summary(root: str, *, reason: str | None = None, job_run: str | None = None, examples: int = 3,
                       storage_options: dict[str, str] | None = None,
                       progress: Callable[..., None] | None = None) -> dict[str, Any]:
    """Quarantined records per reason (most first), each with up to ``examples`` records (file, offset, detail and
    a preview of the record's first bytes), the first by file and offset.

    Streams the table once for the counts and the examples' keys (reason, file, offset), then reads the other
    columns (``raw`` among them) of the examples' rows only: memory stays bounded however many records there are.
    ``progress(stage, done, total)`` hears the rows scanned and the reasons whose examples are read.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from datahub.cli.lake_option import open_lake

    lake = open_lake(root, storage_options=storage_options)
    out: dict[str, Any] = {"lake": lake.root, "total": 0, "reasons": []}
    if not lake.exists("quarantine"):
        return out
    where = None
    if reason is not None:
        where = ds.field("reason") == reason
    if job_run is not None:
        where = (ds.field("run_id") == job_run) if where is None else where & (ds.field("run_id") == job_run)
    counts: dict[str | None, int] = {}
    firsts: dict[str | None, pa.Table] = {}  # per reason: the `examples` smallest (source_uri, source_offset) so far
    order = [("source_uri", "ascending"), ("source_offset", "ascending")]
    report = progress or (lambda stage, done, total=None: None)
    scanned = 0
    report("rows scanned", 0)
    for batch in _scan(lake, ["reason", "source_uri", "source_offset"], where):
        if not batch.num_rows:
            continue
        scanned += batch.num_rows
        report("rows scanned", scanned)
        found = pc.value_counts(batch.column("reason"))
        for value, count in zip(found.field("values").to_pylist(), found.field("counts").to_pylist()):
            counts[value] = counts.get(value, 0) + count
            if examples > 0:
                rows = pa.Table.from_batches([batch]).filter(pc.equal(batch.column("reason"), value) if value is not None
                                                             else pc.is_null(batch.column("reason")))
                rows = pa.concat_tables([t for t in (firsts.get(value), rows) if t is not None])
                firsts[value] = rows.take(pc.select_k_unstable(rows, k=min(examples, rows.num_rows), sort_keys=order))
    out["total"] = sum(counts.values())
    for done, (name, count) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] or ""))):
        if examples > 0:
            report("examples", done, len(counts))
        item: dict[str, Any] = {"reason": name, "records": count, "examples": []}
        keys = firsts.get(name)
        if keys is not None and keys.num_rows:
            match = (ds.field("reason") == name) if name is not None else ds.field("reason").is_null()
            if job_run is not None:
                match = match & (ds.field("run_id") == job_run)
            match = (match & ds.field("source_uri").isin(keys.column("source_uri").unique())
                     & ds.field("source_offset").isin(keys.column("source_offset").unique()))
            wanted = set(zip(keys.column("source_uri").to_pylist(), keys.column("source_offset").to_pylist()))
            picked = [row for batch in _scan(lake, EXAMPLE_COLUMNS, match, RAW_SCAN_ROWS) for row in batch.to_pylist()
                      if (row["source_uri"], row["source_offset"]) in wanted]
            picked.sort(key=lambda r: (r["source_uri"] or "", r["source_offset"] or 0))
            item["examples"] = [{**{k: v for k, v in row.items() if k != "raw"}, "raw_preview": _preview(row["raw"])}
                                for row in picked[:examples]]
        out["reasons"].append(item)
    if examples > 0 and counts:
        report("examples", len(counts), len(counts))
    return out


def _other_runs(root: str, run: str) -> str:
    """A mistyped --run id must not read as a clean run: the runs that did quarantine records, the closest first."""
    import pyarrow.compute as pc

    from datahub.cli.lake_option import open_lake
    from datahub.close_names import did_you_mean

    lake = open_lake(root)
    if not lake.exists("quarantine"):
        return ""
    seen: set[str] = set()  # one entry per run, streamed: the table may hold millions of rows
    for batch in _scan(lake, ["run_id"], None):
        seen.update(pc.unique(batch.column("run_id")).drop_null().to_pylist())
    runs = sorted(seen - {run})
    if not runs:
        return ""
    listed = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    return f" (runs that quarantined records: {listed}{did_you_mean(run, runs)})"


EXAMPLES = """Examples:
  datahub quarantine --lake lake/demo
  datahub quarantine --lake lake/demo --reason invalid_json --examples 10
  # one run's records (run ids: datahub runs --lake lake/demo)
  datahub quarantine --lake lake/demo --run demo-6f4acf5e741f --json"""


def register(app: typer.Typer) -> None:
    @app.command("quarantine", epilog=EXAMPLES)
    def quarantine(
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        reason: Optional[str] = typer.Option(None, "--reason", help="Only this reason (e.g. invalid_json)."),
        run: Optional[str] = typer.Option(None, "--run", help="Only records quarantined by this run id."),
        examples: int = typer.Option(3, "--examples", min=0, help="Example records shown per reason."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Count quarantined records by reason, with example records (file, offset, what was wrong)."""
        from rich.table import Table

        from datahub.cli.arguments import given

        given(reason, "--reason", what="a quarantine reason (e.g. invalid_json), or drop --reason")
        given(run, "--run", what="a run id (`datahub runs --lake LAKE` lists them), or drop --run")
        with progress(f"quarantine {lake}", enabled=not as_json) as update:
            summary = quarantine_summary(lake, reason=reason, job_run=run, examples=examples, progress=update)
        if as_json:
            print_json(summary)
        if not summary["reasons"]:
            present = [] if reason is None else [item["reason"] for item in
                                                 quarantine_summary(lake, job_run=run, examples=0)["reasons"]]
            nothing = (f"nothing quarantined in {plain(summary['lake'])}" + (f" with reason {plain(reason)}" if reason else "")
                       + (f" by run {plain(repr(run))}" if run else "")
                       + (f" (reasons there: {plain(', '.join(sorted(present)))})" if present else "")
                       + (plain(_other_runs(lake, run)) if run else ""))
            if not as_json:
                console().print(nothing, soft_wrap=True)
            elif reason or run:  # the JSON has no reasons; the why on stderr, so a mistyped filter shows in a log
                console(stderr=True).print(f"note: {nothing}", soft_wrap=True)
            return
        if as_json:
            return
        out = console()
        grid = Table(title=f"quarantine in {plain(summary['lake'])}: {summary['total']} records")
        grid.add_column("reason", overflow="fold")
        grid.add_column("records", justify="right")
        for item in summary["reasons"]:
            grid.add_row(plain(item["reason"]), str(item["records"]))
        out.print(grid)
        for item in summary["reasons"]:
            if item["examples"]:
                out.print(f"[bold]{plain(item['reason'])}[/] ({item['records']}), e.g.:")
            for example in item["examples"]:
                where = f"{example['source_uri']}:{example['source_offset']}"
                out.print(f"  {plain(where)}  {plain(example['detail'] or '')}", soft_wrap=True)
                if example["raw_preview"]:
                    out.print(f"    record ({example['raw_size']} bytes): {plain(example['raw_preview'])}", soft_wrap=True)

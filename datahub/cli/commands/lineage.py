"""`datahub lineage SAMPLE_ID | --source URI | optimize`: the story of a sample or of an input file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, fits, plain, print_json

if TYPE_CHECKING:
    from datahub.lineage.query import SampleStory, SourceStory

_COLORS = {"ingested": "cyan", "modified": "yellow", "annotated": "blue", "dropped": "red", "quarantined": "magenta",
           "released": "green", "exported": "green"}


def _print_story(story: SampleStory) -> None:
    out = console()
    out.print(f"[bold]sample {plain(story.sample_id)}[/]  fate: [bold]{story.fate}[/]", soft_wrap=True)
    if not story.events:
        out.print(f"  no lineage events for this id ({_id_hint(story.sample_id)})", soft_wrap=True)
    for event in story.events:
        action = event["action"]
        color = _COLORS.get(action, "white")
        detail = []
        if event["params_hash"]:
            detail.append(f"params {event['params_hash']}")
        if event["reason"]:
            detail.append(f"reason {event['reason']}")
        if event["ref"] is not None:
            detail.append(f"{event['ref']}")
        out.print(f"  {event['ts'][:19]}  [{color}]{action:<11}[/] {plain(event['op'] or ''):<24} run "
                  f"{plain(event['run_id'])}  " + plain("  ".join(detail)), soft_wrap=True)  # a reason may hold [brackets]
    if story.releases:
        out.print(f"  in releases: {', '.join(story.releases)}")


SAMPLE_ID_CHARS = 32  # xxh3-128 as hex (datahub/sample_id.py), for every kind


def _id_hint(sample_id: str) -> str:
    """What to check when an id finds nothing: a shortened or mangled id (copied from a narrow table, or a run id)
    is said to be one; a well-formed one may simply be of another lake."""
    odd = sorted({c for c in sample_id if c not in "0123456789abcdef"})
    if len(sample_id) == SAMPLE_ID_CHARS and not odd:
        return "check the id and the lake, or find the sample with `datahub lineage --source URI`"
    what = [f"{len(sample_id)} characters"] + ([f"with {', '.join(repr(c) for c in odd[:3])}"] if odd else [])
    return (f"a sample id is {SAMPLE_ID_CHARS} lower-case hexadecimal characters, this one has {' '.join(what)}; "
            "copy it whole, or find it with `datahub lineage --source URI`")


def _print_source(story: SourceStory) -> None:
    from rich.table import Table

    out = console()
    records = "1 record" if story.record_count == 1 else f"{story.record_count} records"
    out.print(f"[bold]{plain(story.source_uri)}[/]: {records}: " + ", ".join(f"{k} {v}" for k, v in story.counts.items()),
              soft_wrap=True)  # counts are of samples: a long trajectory's record is several (one per segment)
    grid = Table()
    for column in ("offset", "sample_id", "fate", "reason", "by", "releases"):
        grid.add_column(column, overflow="fold")  # never "…": a sample id must copy whole
    for r in story.records:
        grid.add_row(str(r["source_offset"]), r.get("sample_id") or "-", r["fate"], plain(r.get("reason") or ""),
                     plain(r.get("op") or ""), ", ".join(r.get("releases") or []))
    if fits(out, grid):
        out.print(grid)
        return
    for r in story.records:  # a narrow terminal: a record per line, its sample id whole (a folded id cannot be copied)
        why = " ".join(part for part in (plain(r.get("reason") or ""), f"by {plain(r['op'])}" if r.get("op") else "")
                       if part)
        releases = ", ".join(r.get("releases") or [])
        out.print(f"  {r['source_offset']}  {r.get('sample_id') or '-'}  {r['fate']}" + (f"  {why}" if why else "")
                  + (f"  in {plain(releases)}" if releases else ""), soft_wrap=True)


def _as_listed(source: str) -> str:
    """``source`` as a job lists its input files: a local path is absolute (``data/x.jsonl`` typed in the
    directory the job ran from, or ``file:///...``, finds the records), an object store URI is kept as given."""
    import os

    if source.startswith("file://"):
        source = source.removeprefix("file://")
    elif "://" in source:
        return source
    return os.path.abspath(os.path.expanduser(source))


EXAMPLES = """Examples:
  # one sample's story
  datahub lineage e018a41b37251f2f8a4fce4b025281ee --lake lake/demo
  # what became of each record of an input file
  datahub lineage --source data/demo/docs-a.jsonl.gz --lake lake/demo
  # Z-order the lineage table by sample_id
  datahub lineage optimize --lake lake/demo"""


def register(app: typer.Typer) -> None:
    @app.command("lineage", epilog=EXAMPLES)
    def lineage(
        sample_id: Optional[str] = typer.Argument(None, help="A sample id, or `optimize` to Z-order the lineage table."),
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        source: Optional[str] = typer.Option(None, "--source", help="An input file URI: what became of each record."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """The story of one sample (origin, operators, drops, releases, exports), or of one input file.

        Exit 1 when nothing is found (an unknown sample id or source)."""
        from datahub.cli.lake_option import open_lake
        from datahub.lineage import optimize_lineage, sample_lineage, source_lineage

        root = open_lake(lake)
        if sample_id == "optimize":
            metrics = optimize_lineage(root)
            if as_json:
                print_json(metrics)
            else:
                console().print(f"lineage Z-ordered by sample_id: v{metrics['version']}, "
                                f"{metrics.get('numFilesRemoved')} files -> {metrics.get('numFilesAdded')}")
            return
        if (sample_id is None) == (source is None):
            raise typer.BadParameter("give a SAMPLE_ID or --source URI (one of them)")
        if source is not None:
            from datahub.cli.output import progress

            with progress(f"lineage --source {source}", enabled=not as_json) as update:
                story = source_lineage(root, _as_listed(source), progress=update)
            if as_json:
                print_json(story.as_dict())
            elif story.records:  # an empty table read as a file without records: only the line below is printed
                _print_source(story)
            if not story.records:  # a typo in a script must not look like a file with no records
                console(stderr=True).print(f"no record of {plain(source)} in the lake (check the URI: it must be the input "
                                           "file's URI as the job listed it)", soft_wrap=True)
                raise typer.Exit(1)
            return
        assert sample_id is not None
        sample_story = sample_lineage(root, sample_id)
        print_json(sample_story.as_dict()) if as_json else _print_story(sample_story)
        if not sample_story.events:
            raise typer.Exit(1)

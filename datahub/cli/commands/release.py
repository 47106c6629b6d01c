"""`datahub release ...`: create, list, show, diff, merge, promote, rollback, redact, vacuum (thin over datahub.release)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Optional, cast

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, plain, print_json, progress

if TYPE_CHECKING:
    from datahub.lake.lake import Lake
    from datahub.release.merge_dedup import DedupMode
    from datahub.release.records import Release

LAKE = typer.Option(..., "--lake", help=LAKE_HELP)


class DedupChoice(str, Enum):
    """``release merge --dedup``: the modes of ``datahub.release.merge_dedup``."""

    exact = "exact"
    near = "near"
    none = "none"


def _lake(root: str) -> Lake:
    from datahub.cli.lake_option import open_lake  # a root, or a lake YAML with storage options

    return open_lake(root)


def _print_release(release: Release, *, title: str | None = None) -> None:
    out = console()
    if title:
        out.print(title)
    out.print(f"  name          {release.name}  ({release.kind})")
    out.print(f"  frozen        {release.table} v{release.version}")
    out.print(f"  rows          {release.row_count}")
    out.print(f"  digest        {release.digest}")
    out.print(f"  created       {release.created:%Y-%m-%d %H:%M:%S} UTC by {release.creator}")
    out.print(f"  qa            {release.qa_status.replace('_', ' ')}")
    if release.parents:
        out.print(f"  from          {', '.join(release.parents)}")
    out.print(f"  runs          {', '.join(release.run_ids) or '-'}")
    out.print(f"  channels      {', '.join(release.channels) or '-'}")
    out.print(f"  schema v      {release.schema_version}")
    from datahub.release.evalset_gate import describe_verdict, evalset_verdict

    out.print(f"  eval sets     {plain(describe_verdict(evalset_verdict(release), release.name))}", soft_wrap=True)


def _as_json(release: Release) -> dict[str, Any]:
    """The release's record and the eval-set gate's verdict (``evalset_check``) for --json."""
    from datahub.release.evalset_gate import evalset_verdict

    return {**release.as_dict(), "evalset_check": evalset_verdict(release)}


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Versioned dataset releases: frozen Delta versions, QA-gated, immutable names.",
                        no_args_is_help=True)
    app.add_typer(group, name="release")
    _register_archive(group)  # defined at the end of this module

    @group.command("create")
    def create(
        name: str = typer.Argument(..., help="Release name (immutable), e.g. corpus-2024.06."),
        lake: str = LAKE,
        table: str = typer.Option("samples", "--table", help="Table to freeze."),
        version: Optional[int] = typer.Option(None, "--version", help="Delta version to freeze (default: latest)."),
        require_qa: bool = typer.Option(False, "--require-qa", help="Refuse when no QA suite ran on that version, "
                                        "or, on chat, preference or trajectory data, when posttraining.v1 did not "
                                        "(the suite `datahub qa` runs on those kinds by default)."),
        allow_contamination: Optional[str] = typer.Option(
            None, "--allow-contamination", metavar="REASON",
            help="Release even though samples overlap a registered eval set (datahub evalset); the reason is recorded "
                 "in the release and in each such sample's lineage (datahub lineage ID)."),
        exist_ok: bool = typer.Option(False, "--exist-ok", help="A release NAME that already froze this table "
                                      "version is fine (a retried pipeline step): print it, exit 0. One that froze "
                                      "another version is still refused."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Freeze a table version as a release; refused when its latest QA results failed or it overlaps an eval set."""
        from datahub.release import create_release
        from datahub.release.records import release_exists

        the_lake = _lake(lake)
        existed = exist_ok and release_exists(the_lake, name)
        required: list[str] = []
        if require_qa and not existed and the_lake.exists(table) and (
                version is None or 0 <= version <= int(the_lake.table(table).version())):  # else create refuses
            from datahub.config.suites import DEFAULT_SUITE
            from datahub.qa.results import table_default_suites

            # the kinds' own default suites (posttraining.v1 on chat data); any suite still does for samples.v1's part
            required = [s for s in table_default_suites(the_lake, table=table, version=version) if s != DEFAULT_SUITE]
        with progress(f"release create {name}", enabled=not as_json and not existed) as update:
            release = create_release(the_lake, name, table=table, version=version, require_qa=require_qa,
                                     require_suites=required, allow_contamination=allow_contamination,
                                     progress=update, exist_ok=exist_ok)
        if as_json:
            print_json({**_as_json(release), **({"existed": existed} if exist_ok else {})})
            return
        if existed:
            console().print(f"release {name} already exists ({release.table} v{release.version}): nothing to do")
            return
        _print_release(release, title=f"[bold green]release {name} created[/]")
        if release.qa_status == "no_qa_results":
            console().print(f"  [yellow]note: no QA results for {release.table} v{release.version}[/] "
                            "(use --require-qa to refuse releases without QA)")
        excluded = (release.details or {}).get("redacted_excluded")
        if excluded and excluded.get("rows"):
            console().print(f"  note: left out {excluded['rows']:,} samples taken down by earlier redacts "
                            f"({', '.join(map(str, excluded.get('by') or []))})")

    @group.command("list")
    def list_(lake: str = LAKE, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """All releases, oldest first, with their channels."""
        from rich.table import Table

        from datahub.release import list_releases

        releases = list_releases(_lake(lake))
        if as_json:
            print_json([r.as_dict() for r in releases])
            return
        grid = Table(title=f"releases in {lake}")
        for column in ("name", "kind", "table", "version", "rows", "created", "qa", "channels"):
            grid.add_column(column)
        for r in releases:
            grid.add_row(r.name, r.kind, r.table, str(r.version), str(r.row_count), f"{r.created:%Y-%m-%d %H:%M}",
                         r.qa_status, ", ".join(r.channels))
        console().print(grid if releases else f"no releases in {lake}")

    @group.command("show")
    def show(name: str = typer.Argument(...), lake: str = LAKE,
             as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """One release in detail."""
        from datahub.release import get_release

        release = get_release(_lake(lake), name)
        if as_json:
            print_json(_as_json(release))
            return
        _print_release(release, title=f"[bold]release {name}[/]")
        if release.details:
            console().print(f"  details       {plain(release.details)}", soft_wrap=True)

    @group.command("diff")
    def diff(
        old: str = typer.Argument(..., help="The older release."),
        new: str = typer.Argument(..., help="The newer release."),
        lake: str = LAKE,
        ids: bool = typer.Option(False, "--ids", help="Also list the added and removed sample ids."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Samples added and removed between two releases, overall and per source."""
        from rich.table import Table

        from datahub.release import diff_releases

        with progress(f"release diff {old} {new}", enabled=not as_json) as update:
            result = diff_releases(_lake(lake), old, new, with_ids=ids, progress=update)
        if as_json:
            print_json(result.as_dict())
            return
        out = console()
        out.print(f"[bold]{old} -> {new}[/]: [green]+{result.added}[/] [red]-{result.removed}[/] ({result.unchanged} unchanged)")
        if result.by_source:
            grid = Table()
            for column in ("source", "added", "removed"):
                grid.add_column(column)
            for source, c in result.by_source.items():
                grid.add_row(source, str(c["added"]), str(c["removed"]))
            out.print(grid)
        if ids:
            for sample_id in result.added_ids or []:
                out.print(f"+ {sample_id}")
            for sample_id in result.removed_ids or []:
                out.print(f"- {sample_id}")

    @group.command("merge")
    def merge(
        new: str = typer.Argument(..., help="Name of the merged release."),
        sources: list[str] = typer.Option(..., "--from", help="An input release (repeat: --from A --from B)."),
        lake: str = LAKE,
        weights: Optional[str] = typer.Option(None, "--weights", help="Mixture per input release: A=0.7,B=0.3."),
        dedup: DedupChoice = typer.Option(DedupChoice.exact, "--dedup",
                                          help="Cross-release dedup: exact (normalized content hash), near (MinHash-LSH) or none."),
        no_dedup: bool = typer.Option(False, "--no-dedup", help="Keep every row (the same as --dedup none)."),
        threshold: float = typer.Option(0.8, "--threshold", help="--dedup near: Jaccard similarity of near duplicates, "
                                                                 "in (0, 1]."),
        verify: bool = typer.Option(True, "--verify/--no-verify",
                                    help="--dedup near: drop only candidates whose exact shingle Jaccard reaches --threshold."),
        seed: int = typer.Option(0, "--seed", help="Seed of the weighted sampling."),
        allow_contamination: Optional[str] = typer.Option(
            None, "--allow-contamination", metavar="REASON",
            help="Merge even though samples of an input release overlap a registered eval set (datahub evalset); "
                 "the reason is recorded in the release and in each such sample's lineage (datahub lineage ID)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Combine releases into a new frozen one (deduplicated, optionally weighted).

        Refused, as release create is, when an input release overlaps a registered eval set (an input an earlier
        release checked clean at the same version against the same eval-set versions is not read again)."""
        from datahub.release import merge_releases, parse_weights

        if not 0 < threshold <= 1:  # before any reading, and not as the dedup params' pydantic dump
            raise typer.BadParameter(f"must be in (0, 1], got {threshold}", param_hint="--threshold")
        mode = cast("DedupMode", "none" if no_dedup else dedup.value)  # DedupChoice lists the modes
        with progress(f"release merge {new}", enabled=not as_json) as update:
            release = merge_releases(_lake(lake), new, sources=sources, weights=parse_weights(weights), dedup=mode,
                                     threshold=threshold, verify=verify, seed=seed,
                                     allow_contamination=allow_contamination, progress=update)
        if as_json:
            print_json(_as_json(release))
            return
        _print_release(release, title=f"[bold green]release {new} merged[/]")
        d = release.details
        console().print(f"  read          {d['rows_read']}; duplicates removed {d['duplicates_removed']}"
                        + (f"; quotas {d['quotas']}" if d.get("quotas") else ""))

    @group.command("promote")
    def promote_(name: str = typer.Argument(...), lake: str = LAKE,
                 channel: str = typer.Option("stable", "--channel", help="Channel to move."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Point a channel at a release."""
        from datahub.release import promote

        promote(_lake(lake), name, channel=channel)
        if as_json:
            print_json({"channel": channel, "release": name})
            return
        console().print(f"[green]{channel}[/] -> {name}")

    @group.command("rollback")
    def rollback_(lake: str = LAKE, channel: str = typer.Option("stable", "--channel", help="Channel to move back."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """Move a channel back to the release it pointed at before."""
        from datahub.release import rollback

        release = rollback(_lake(lake), channel=channel)
        if as_json:
            print_json({"channel": channel, "release": release.name if release else None})
            return
        console().print(f"[yellow]{channel}[/] rolled back -> {release.name if release else '-'}")

    @group.command("redact")
    def redact_(
        new: str = typer.Argument(..., help="Name of the new release without the samples."),
        source: str = typer.Option(..., "--from", help="The release to redact from."),
        lake: str = LAKE,
        sample: list[str] = typer.Option([], "--sample", help="A sample id to remove (repeatable)."),
        source_uri: Optional[str] = typer.Option(None, "--source", help="Remove every sample of this input file."),
        ids_file: list[str] = typer.Option([], "--ids-file", help="A file of sample ids, one per line (repeatable)."),
        reason: str = typer.Option(..., "--reason", help="Why (recorded in lineage): copyright, PII, ..."),
        allow_contamination: Optional[str] = typer.Option(
            None, "--allow-contamination", metavar="REASON",
            help="Release even though samples that stay overlap a registered eval set (datahub evalset); the reason "
                 "is recorded in the release and in each such sample's lineage (datahub lineage ID)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Take-down: a new release without the samples; lists every release that holds them.

        Refused, as release create is, when the samples that stay overlap an eval set registered now: take those
        down too (`datahub evalset check --release FROM --ids-out FILE`, then --ids-file FILE) or give
        --allow-contamination. A clean check of --from against the same eval sets is taken without reading its
        rows again; when --from was released with allowed contamination against the same eval sets, that reason
        carries over to its samples that stay."""
        from datahub.release import redact

        # the ids files are read a block at a time by redact (a take-down list of millions of ids is never held)
        with progress(f"release redact {new}", enabled=not as_json) as update:
            release = redact(_lake(lake), new, source=source, reason=reason, sample_ids=list(sample),
                             ids_files=list(ids_file), source_uri=source_uri,
                             allow_contamination=allow_contamination, progress=update)
        if as_json:
            print_json(_as_json(release))
            return
        _print_release(release, title=f"[bold green]release {new} created without {release.details['removed']} sample(s)[/]")
        out = console()
        out.print(f"  reason        {plain(reason)}", soft_wrap=True)  # as given: "[legal] #7" is not markup
        out.print("  [bold]releases holding the redacted samples[/] (they stay readable by time travel until "
                  "`datahub release vacuum --drop-release NAME --apply`):")
        for name, count in release.details["contained_in"].items():
            out.print(f"    {name}: {count}")

    @group.command("vacuum")
    def vacuum_(
        lake: str = LAKE,
        table: str = typer.Option("samples", "--table", help="Table whose unreferenced data files to delete."),
        retention_hours: int = typer.Option(168, "--retention-hours", help="Keep files that versions this recent need."),
        drop_release: list[str] = typer.Option([], "--drop-release",
                                                help="A release whose data may go (repeatable); it becomes unreadable."),
        apply: bool = typer.Option(False, "--apply", help="Delete (default: a dry run that lists the files)."),
        force: bool = typer.Option(False, "--force", help="Allow --retention-hours below 24 (no job may be writing)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Delete old data files explicitly; every release keeps its files unless named with --drop-release."""
        from datahub.release import vacuum

        report = vacuum(_lake(lake), table, retention_hours=retention_hours, drop_releases=drop_release,
                        apply=apply, force=force)
        if as_json:
            print_json(report.as_dict())
            return
        out = console()
        verb = "deleted" if report.applied else "would delete (dry run; --apply deletes)"
        out.print(f"{table}: {verb} {len(report.files)} file(s)")
        for path in report.files:
            out.print(f"  {path}")
        out.print(f"  releases kept readable: {', '.join(report.kept_releases) or '-'}")
        if report.unreadable_releases:
            state = "no longer readable" if report.applied else "that --apply makes unreadable"
            out.print(f"  [red]releases {state}[/]: {', '.join(report.unreadable_releases)}")


def _register_archive(group: typer.Typer) -> None:
    @group.command("archive")
    def archive(
        name: str = typer.Argument(..., help="The release to archive."),
        lake: str = LAKE,
        undo: bool = typer.Option(False, "--undo", help="Un-archive: the policy places it by channel and reads again."),
        reason: Optional[str] = typer.Option(None, "--reason", help="Why (kept with the event)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Archive a release: an append-only event; `datahub tier apply` then moves it to the cold tiers."""
        from datahub.release.events import archive_release

        changed = archive_release(_lake(lake), name, undo=undo, reason=reason)
        state = "unarchived" if undo else "archived"
        if as_json:
            print_json({"release": name, "state": state, "changed": changed})
            return
        console().print(f"release {name} {state}" if changed else f"release {name} was already {state}")

"""`datahub evalset add/list/check`: the evaluation-set registry and contamination checks (thin over datahub.evalset)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from datahub.cli.lake_option import LAKE_HELP
from datahub.cli.output import console, plain, print_json
from datahub.cli.release_option import RELEASE_HELP

if TYPE_CHECKING:
    import pyarrow as pa

JSON_EXAMPLES = 20  # contaminated sample ids `evalset check --json` lists (the rest stream past, not held)


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Evaluation sets (benchmarks) a release must not contain: register, list, check.",
                        no_args_is_help=True)
    app.add_typer(group, name="evalset")

    @group.command("add")
    def add(
        name: str = typer.Argument(..., help="Eval set name, e.g. mmlu (refs read NAME@VERSION:ITEM)."),
        path: str = typer.Argument(..., help="JSONL (.gz) or Parquet: one item per record with prompt/question and "
                                             "answer/output fields, or a conversation (messages, conversations, "
                                             "turns); optional id (id, task_id, question_id)."),
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        prompt_field: Optional[list[str]] = typer.Option(
            None, "--prompt-field", help="A field holding the item's question (repeatable; their texts one per "
                                         "line), for a layout the known names miss. Known without it: "
                                         "sentence/option1/option2, premise/hypothesis, ctx/endings, goal/sol1/sol2."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Register a benchmark's items as the next version of an eval set (unchanged content: no new version).
        An item with no question, or under 4 words (a label alone, e.g. "1"), is refused: it would match any
        sample or chat turn saying just that."""
        from datahub.cli.lake_option import open_lake
        from datahub.evalset import add_evalset

        result = add_evalset(open_lake(lake, must_exist=False), name, path,  # may be a new lake's first table
                             prompt_fields=prompt_field)
        if as_json:
            print_json(result.as_dict())
            return
        verb = "added" if result.created else "unchanged, already registered as"
        console().print(f"[bold green]eval set {result.name}@{result.version}[/] {verb}: {result.items} items "
                        f"from {result.source_uri}")

    @group.command("list")
    def list_(
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        all_versions: bool = typer.Option(False, "--all-versions", help="Every version, not only the latest."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Registered eval sets (latest version of each)."""
        from rich.table import Table

        from datahub.cli.lake_option import open_lake
        from datahub.evalset import list_evalsets

        sets = list_evalsets(open_lake(lake), all_versions=all_versions)
        if as_json:
            print_json([s.as_dict() for s in sets])
            return
        if not sets:
            console().print(f"no eval sets in {lake}; register one with: datahub evalset add NAME PATH --lake {lake}")
            return
        grid = Table(title=f"eval sets in {lake}")
        for column in ("name", "version", "items", "versions", "added", "source"):
            grid.add_column(column)
        for s in sets:
            grid.add_row(s.name, str(s.version), str(s.items), str(s.versions), f"{s.added:%Y-%m-%d %H:%M}", s.source_uri)
        console().print(grid)

    @group.command("check")
    def check(
        lake: str = typer.Option(..., "--lake", help=LAKE_HELP),
        table: str = typer.Option("samples", "--table", help="Table to check."),
        version: Optional[int] = typer.Option(None, "--version", help="Delta version (default: latest)."),
        release: Optional[str] = typer.Option(None, "--release", help=RELEASE_HELP + " E.g. one made before an "
                                              "eval set was registered."),
        ngram: int = typer.Option(13, "--ngram", min=3, help="Words per n-gram."),
        min_overlap: int = typer.Option(1, "--min-overlap", min=1, help="Matching n-grams that make a sample contaminated."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        ids_out: Optional[Path] = typer.Option(None, "--ids-out", help="Write every contaminated sample id to this "
                                               "file, one per line (for `datahub release redact --ids-file`); "
                                               f"--json lists {JSON_EXAMPLES} examples only."),
    ) -> None:
        """Count samples of a table version (or of a release) that share n-grams with the registered eval sets (streamed).

        Exit 1 when any does, naming the eval sets and example sample ids."""
        from datahub.cli.lake_option import open_lake
        from datahub.cli.output import progress
        from datahub.cli.release_option import release_table
        from datahub.evalset import contamination

        root = open_lake(lake)
        table, version = release_table(root, release, table, version)
        what = f"release {release} ({table} v{{version}})" if release is not None else f"{table} v{{version}}"
        done = [0]
        with progress(f"checking {table}", enabled=not as_json) as update:
            def advance(rows: int) -> None:
                done[0] += rows
                update("rows", done[0])

            with open(ids_out, "w") if ids_out is not None else contextlib.nullcontext() as out:
                def write_ids(hits: pa.Table) -> None:  # sorted blocks of the distinct contaminated ids
                    if out is not None and hits.num_rows:
                        out.write("".join(f"{sample_id}\n" for sample_id in hits.column("sample_id").to_pylist()))

                found = contamination(root, table=table, version=version, ngram=ngram, min_overlap=min_overlap,
                                      progress=advance, hits=write_ids, examples=JSON_EXAMPLES)
        what = what.format(version=found.version)
        if as_json:
            print_json({**found.as_dict(), **({"release": release} if release is not None else {}),
                        "examples": dict(sorted(found.refs.items()))})
        elif not found.evalsets:
            console().print("no eval sets registered: nothing to check against")
        elif found.count:  # the description's "[set@1: n sample(s)]" is text, not Rich markup
            named = f"release {release}: " if release is not None else ""
            console().print(f"[bold red]contaminated[/]: {plain(named + found.describe())}", soft_wrap=True)
        else:
            console().print(f"[green]clean[/]: {found.rows_checked} rows of {plain(what)} share no "
                            f"{ngram}-gram with {', '.join(found.evalsets)}")
        if found.count:  # like a failed `datahub qa`: a scheduled check fails the job
            raise typer.Exit(1)

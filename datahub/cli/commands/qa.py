"""`datahub qa --lake LAKE`: run a Great Expectations suite on a table version; exit 1 when it fails."""

from __future__ import annotations

from typing import Optional

import typer

from datahub.cli.lake_option import LAKE_ARGUMENT_HELP, LAKE_HELP, lake_ref
from datahub.cli.output import console, print_json, progress
from datahub.cli.release_option import RELEASE_HELP


EXAMPLES = """Examples:
  datahub qa --lake lake/demo
  # as JSON, on a post-training demo lake (make demo; datahub run jobs/chat-demo.yaml): a failed row check
  # lists up to 20 unexpected_sample_ids
  datahub qa --lake lake/chat-demo --json
  # your own suite file, on Spark, not recorded in qa_results
  datahub qa --lake lake/demo --suite suites/mine.v1.json --engine spark --no-record
  datahub qa --lake lake/demo --release corpus-v1"""


def register(app: typer.Typer) -> None:
    @app.command("qa", epilog=EXAMPLES)
    def qa(
        lake_arg: Optional[str] = typer.Argument(None, metavar="LAKE", help=LAKE_ARGUMENT_HELP, show_default=False),
        lake: Optional[str] = typer.Option(None, "--lake", help=LAKE_HELP),
        version: Optional[int] = typer.Option(None, "--version", help="Table version to check (default: latest)."),
        suite: Optional[list[str]] = typer.Option(
            None, "--suite", show_default=False,
            help="Suite name under schemas/gx, or a path to a suite .json (repeatable). Default: samples.v1, plus "
                 "posttraining.v1 when the table has chat, preference or trajectory columns (messages, "
                 "chosen/rejected, steps)."),
        table: str = typer.Option("samples", "--table", help="Lake table to validate."),
        release: Optional[str] = typer.Option(None, "--release", help=RELEASE_HELP),
        no_record: bool = typer.Option(False, "--no-record", help="Do not write the result to qa_results."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
        engine: str = typer.Option("local", "--engine", help="local (one streaming pass in this process), ray (the "
                                   "same aggregates in Ray tasks, one per data file) or spark (Great Expectations' "
                                   "Spark engine on a Spark DataFrame)."),
        address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address or Spark master URL "
                                              "(default: an embedded local engine)."),
    ) -> None:
        """Validate a table version against QA suites and record the outcome in qa_results.

        samples.v1: sample ids, non-empty text, document lengths (at most
        1,000,000 characters on text and image_text rows, a null or absent
        kind being text; chat, preference and trajectory rows are not
        documents: ingest's limits.max_record_bytes bounds them), exact
        duplicates, quality signals.

        posttraining.v1, run by default on tables with chat, preference or
        trajectory columns, checks columns derived per batch from the nested
        ones (datahub/qa/posttraining.py documents each):
        chat: messages_assistant_turns >= 1, messages_empty_assistant_turns
        = 0 (no assistant message with empty content and no tool call; an
        empty system or tool turn is fine), messages_last_role = assistant; preference: chosen_turns and rejected_turns >= 1,
        chosen_empty_turns and rejected_empty_turns = 0,
        chosen_equals_rejected = false; trajectory: steps_count >= 1,
        steps_within_episode = true. Also derived, for your own suites:
        messages_turns, messages_empty_turns (empty turns of any role),
        steps_reward_nulls. Rows of other kinds are null
        there and not judged.

        A failed row check names the sample_id of its first rows (--json:
        unexpected_sample_ids, up to 20, in scan order: the same ids on
        every engine).

        Exit 1 when a suite fails (the version is then unreleasable), 2 on a usage error."""
        from datahub.cli.lake_option import open_lake
        from datahub.qa import run_suites

        if engine not in ("local", "ray", "spark"):
            raise typer.BadParameter(f"use local, ray or spark, got {engine!r}", param_hint="--engine")
        from datahub.cli.release_option import release_table

        the_lake = open_lake(lake_ref(lake_arg, lake, command="qa"))
        table, version = release_table(the_lake, release, table, version)
        running = None
        if engine != "local":
            from datahub.config.spec import EngineSpec
            from datahub.engines.registry import make_engine

            spec = EngineSpec(kind="ray", address=address) if engine == "ray" else EngineSpec(kind="spark", master=address)
            running = make_engine(spec)
            running.start()
        try:
            with progress(f"qa {table}", enabled=not as_json) as update:
                results = run_suites(the_lake, suites=suite, table=table,
                                     version=version, commit=not no_record, engine=running or "local", progress=update)
        finally:
            if running is not None:
                running.stop()
        ok = all(r.success for r in results)
        if as_json:
            print_json({"success": ok, "results": [r.as_dict() for r in results]})
        else:
            out = console()
            for r in results:
                mark = "[green]passed[/]" if r.success else "[bold red]FAILED[/]"
                out.print(f"{r.suite} (v{r.suite_version}) on {r.table}@{r.table_version}: {mark}")
                absent = [e["kwargs"]["column"] for e in r.results if e["success"] is None and _absent_column(e)]
                names = the_lake.dataset(r.table, r.table_version).schema.names if absent else []
                for why, columns in _absent_reasons(absent, set(names)).items():
                    out.print(f"  skip {len(columns)} optional expectation{'s' if len(columns) > 1 else ''}: columns "
                              f"not in this table ({why}): {', '.join(columns)}", soft_wrap=True)
                for e in r.results:
                    if e["success"] is None and _absent_column(e):
                        continue
                    state = "skip" if e["success"] is None else ("ok  " if e["success"] else "FAIL")
                    column = e["kwargs"].get("column", "")
                    extra = e.get("skipped") or e.get("error") or _observed(e["observed"])
                    if e["success"] is False and e.get("unexpected_sample_ids"):
                        extra = f"{extra} {_ids(e['unexpected_sample_ids'])}"
                    if e.get("spark_fallback"):
                        extra = f"{extra} [{e['spark_fallback']}]".strip()
                    out.print(f"  {state} {e['expectation']} {column} {extra}")
        if not ok:
            raise typer.Exit(1)


def _absent_column(entry: dict) -> bool:
    """An optional expectation skipped because its column is not in the table (datahub.qa.validate.plan_suite)."""
    column = (entry.get("kwargs") or {}).get("column")
    return column is not None and entry.get("skipped") == f"column {column!r} not in table"


def _absent_reasons(columns: list[str], table_columns: set[str]) -> dict[str, list[str]]:
    """Skipped optional columns by why they are absent: post-training columns derived from a kind's columns the
    table (``table_columns``) lacks (datahub.qa.posttraining): no samples of that kind when its list column is
    absent, else the missing columns by name; or signals no operator wrote (a chat or image job has no gopher
    ones)."""
    from datahub.qa.posttraining import DERIVED

    reasons: dict[str, list[str]] = {}
    for column in columns:
        derived = DERIVED.get(column)
        lacking = [source for source in derived.sources if source not in table_columns] if derived else []
        if derived is None:
            why = "signals no operator of its job wrote"
        elif derived.sources[0] in lacking:  # the kind's list column: messages, chosen/rejected or steps
            why = f"no {derived.kind} samples"
        else:
            why = f"no {', '.join(lacking)} column" if lacking else f"{derived.kind} columns of another type"
        reasons.setdefault(why, []).append(column)
    return reasons


def _ids(ids: list[str], shown: int = 3) -> str:
    """The first sample ids of a failed check's unexpected rows (--json lists up to 20)."""
    more = f" and {len(ids) - shown} more in --json" if len(ids) > shown else ""
    return f"sample_id {', '.join(ids[:shown])}{more}"


def _observed(observed: dict | None) -> str:
    if not observed:
        return ""
    if "observed_value" in observed:
        return f"observed={observed['observed_value']}"
    if observed.get("unexpected_count"):
        count, rows = observed["unexpected_count"], observed.get("element_count")
        percent = observed.get("unexpected_percent")
        line = f"unexpected={count}/{rows}"
        if rows and percent is not None and abs(percent - 100.0 * count / rows) > 1e-9:  # nulls are not judged
            line += f" ({percent:.3g}% of the non-null values)"
        return line
    return ""

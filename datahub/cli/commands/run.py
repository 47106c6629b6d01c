"""`datahub run JOB.yaml`: run a job spec (incremental by default)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional

import typer

from datahub.cli.output import console, plain, print_json, progress
from datahub.errors import SpecError

if TYPE_CHECKING:
    from datahub.pipeline.run import RunResult


# the docstring's first line, and what a script branches on (one paragraph each: the help keeps line breaks)
HELP = ("Run a job: ingest -> operator graph -> Delta lake, as one idempotent commit per table.\n\n"
        "Exit 0 when the run succeeded or had nothing to do (no new input files); 2 when the spec, an option or an "
        "input is wrong, or the job is already running (one `error:` line); another non-zero status when the run "
        "failed (`datahub runs --lake LAKE` shows its error and the command that resumes it). A failed QA suite of "
        "the job's `qa:` section does not change it: the summary and --json say so, and `datahub qa` exits 1.")

EXAMPLES = """Examples:
  # validate the spec and list its input files; run nothing
  datahub run jobs/demo.yaml --check
  # incremental: only input files not ingested before
  datahub run jobs/demo.yaml
  datahub run jobs/demo.yaml --lake /data/lake --json
  datahub run jobs/demo.yaml --set graph.dedup.params.threshold=0.9
  # every input file again, on Spark
  datahub run jobs/demo.yaml --engine spark --full"""


def register(app: typer.Typer) -> None:
    @app.command("run", epilog=EXAMPLES, help=HELP)
    def run(
        job: Path = typer.Argument(..., help="Job spec YAML, e.g. jobs/demo.yaml.", exists=False),
        lake: Optional[str] = typer.Option(None, "--lake", help="Override the spec's lake: a root (a path or "
                                           "s3://bucket/prefix) for lake.root, or a lake YAML with root + "
                                           "storage_options (or another job spec) for the whole lake section."),
        engine: Optional[str] = typer.Option(None, "--engine", help="Override engine.kind: ray | spark."),
        set_: list[str] = typer.Option([], "--set", help="Override any spec field: --set graph.dedup.params.threshold=0.9 (repeatable)."),
        full: bool = typer.Option(False, "--full", help="Reprocess every input file, not only new ones."),
        as_json: bool = typer.Option(False, "--json", help="Print the run result as JSON."),
        check: bool = typer.Option(False, "--check", help="Only validate the spec and list the inputs; run nothing."),
    ) -> None:
        """Run a job: ingest -> operator graph -> Delta lake, as one idempotent commit per table."""
        from datahub.config.spec import load_job_spec
        from datahub.pipeline.graph import build_graph
        from datahub.lake import Lake
        from datahub.pipeline.run import list_job_inputs, run_job
        from datahub.qa import run_for_job

        from datahub.cli.lake_option import is_lake_file, load_lake_spec

        from datahub.cli.arguments import given

        given(lake, "--lake", what="a lake root (a path or s3://bucket/prefix) or a lake YAML, or drop --lake to "
              "use the spec's lake")
        given(engine, "--engine", what="ray or spark, or drop --engine to use the spec's")
        overrides = list(set_)
        lake_file = lake is not None and is_lake_file(lake)
        clash = [o for o in overrides if o.split("=", 1)[0].strip() == "lake" or o.startswith("lake.")]
        if lake_file and clash:  # the file replaces the spec's lake section: the override would be dropped silently
            raise SpecError(f"--set {clash[0]} and --lake {lake} both set the lake; put the field in {lake}, or give "
                            "--lake a root directory or URI with --set")
        if lake and not lake_file:
            overrides.append(f"lake.root={lake}")
        if engine:
            overrides.append(f"engine.kind={engine}")
        spec = load_job_spec(job, overrides)
        if lake_file:  # as every other command's --lake: the file's root and storage options, not a root named *.yaml
            assert lake is not None
            spec = spec.model_copy(update={"lake": load_lake_spec(lake)})
        if check or set_:  # operators, params, edges: what run_job checks first, with the --set items named
            build_graph(spec, source=str(job), overrides=list(set_))
        if check:
            # as the run would list them: an input matching nothing is an error until the job has run once
            listing = list_job_inputs(spec, Lake(spec.lake.root, storage_options=spec.lake.storage_options),
                                      source=str(job), full=full)
            files = listing.files
            if as_json:
                print_json({"job": spec.name, "valid": True, "lake": spec.lake.root, "inputs": [f.uri for f in files],
                            "notes": listing.unmatched})
            else:
                out = console()
                out.print(f"[green]ok[/] {plain(job)}: job {plain(repr(spec.name))}, {len(spec.graph)} graph nodes, "
                          f"lake {plain(spec.lake.root)}, {len(files)} input files:", soft_wrap=True)
                for f in files:
                    out.print(f"  {plain(f.uri)}  ({f.size} bytes)", soft_wrap=True)
                for note in listing.unmatched:
                    out.print(f"  {plain(note)} (the job ran before: a run with nothing new is a no-op)", soft_wrap=True)
            return
        logging.getLogger("ray").setLevel(logging.WARNING)
        with progress(f"run {spec.name}", enabled=not as_json) as update:

            def qa_phase(*args: Any, **kwargs: Any) -> Any:  # the QA phase shows in the progress too
                update("qa", 0)
                try:
                    return run_for_job(*args, **kwargs)
                finally:
                    update("qa done", 1, 1)

            result = run_job(spec, full=full, progress=update, source=str(job), qa_gate=qa_phase)
        if as_json:
            print_json(result.as_dict())
            return
        _summary(result)

    def _summary(result: RunResult) -> None:
        out = console()
        if result.status in ("skipped", "already_committed"):
            reason = "no new input files" if result.status == "skipped" else "this run was committed before"
            reason = "; ".join([reason, *result.notes])  # e.g. an emptied landing directory's input
            out.print(f"[yellow]nothing to do[/] ({plain(reason)}); lake {plain(result.lake)}", soft_wrap=True)
            return
        c = result.counts
        out.print(f"[bold green]run {result.run_id} {result.status}[/] in {result.duration_s:.1f}s")
        for note in result.notes:
            out.print(f"  note               {plain(note)}", soft_wrap=True)
        out.print(f"  inputs read        {len(result.inputs)} files, {c.get('records_read', 0)} records")
        out.print(f"  samples written    {c.get('samples_written', 0)}")
        dropped = c.get("dropped", {})
        out.print(f"  samples dropped    {c.get('dropped_total', 0)}" + (f"  ({', '.join(f'{k}: {v}' for k, v in dropped.items())})" if dropped else ""))
        quarantined = c.get("quarantined", {})
        out.print(f"  quarantined        {c.get('quarantined_total', 0)}" + (f"  ({', '.join(f'{k}: {v}' for k, v in quarantined.items())})" if quarantined else ""))
        qa = c.get("qa")
        if qa:
            verdicts = ", ".join(f"{name} {'passed' if v['success'] else 'FAILED (%d expectations)' % v['failed']}"
                                 for name, v in qa["suites"].items())
            colour = "green" if qa["success"] else "red"
            out.print(f"  qa                 [{colour}]{verdicts}[/] ({qa['table']} v{qa['table_version']})")
        for name, stats in result.stats.items():  # the graph's `sink: stats` nodes
            sources = list(stats.get("live_by_source", {}).items())
            by_source = ", ".join(f"{plain(k)}: {v}" for k, v in sources[:5]) + (f", {len(sources) - 5} more" if len(sources) > 5 else "")
            out.print(f"  stats {plain(name):<12} {stats.get('rows', 0)} rows, {stats.get('live_chars', 0)} live chars"
                      + (f" (by source: {by_source})" if by_source else ""), soft_wrap=True)
        out.print(f"  lake               {result.lake}")
        versions = ", ".join(f"{t} v{v}" for t, v in result.table_versions.items() if v is not None)
        out.print(f"  delta versions     {versions or 'unchanged'}")

"""``release.create``: freeze a Delta version of a table under an immutable name, QA-gated and
checked against the registered evaluation sets (``datahub.evalset``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from datahub.errors import EvalSetsChangedError, ReleaseError
from datahub.lake.external_sort import SortedRuns
from datahub.lake.lake import Lake
from datahub.lake.tables import not_of_samples
from datahub.progress import Progress
from datahub.release.freeze import (check_key, committed_params, freeze, history_runs, logged_rows,
                                    refuse_other_allowance, refuse_taken)
from datahub.release.qa_gate import qa_command, qa_verdict
from datahub.release.records import MATERIALIZED_PREFIX, Release, check_name, get_release, release_exists
from datahub.release.evalset_gate import NOTES, contamination_notes, no_notes, registered_digests, rows_done
from datahub.release.exclude import exclude_redacted

def create_release(
    lake: Lake,
    name: str,
    *,
    table: str = "samples",
    version: int | None = None,
    require_qa: bool = False,
    require_suites: Sequence[str] = (),
    creator: str | None = None,
    allow_contamination: str | None = None,
    progress: Progress | None = None,
    exist_ok: bool = False,
) -> Release:
    """Freeze ``table`` at ``version`` (default: latest) as release ``name``.

    Refused when the name exists, when the latest result of any QA suite for that version
    failed, (with ``require_qa``) when no QA ran on it, or when samples share 13-grams with a
    registered eval set, unless ``allow_contamination`` gives the reason (recorded in the
    release's details and in the contaminated samples' ``released`` lineage rows). An eval set registered after the
    check, while the release is written, refuses it before its record is committed (``freeze``; run it again).
    ``require_suites``: suites that must have a result on that version. ``datahub release create --require-qa``
    passes the table's kind-specific default suites (``datahub.qa.table_default_suites`` less ``samples.v1``), so a
    chat table checked by samples.v1 alone is refused until posttraining.v1 ran; a Python caller passes them the
    same way (this layer does not import ``datahub.qa``, which imports it).

    Samples taken down by an earlier ``release redact`` (its ids, or every row of its ``source_uri``) stay out:
    when the version holds any, the release is materialized in ``release_<name>`` without them
    (``details["redacted_excluded"]``, and a ``dropped`` lineage row each).
    ``progress(stage, done, total)`` gets the rows of each pass (eval-set check, the taken-down rows left out,
    then ``freeze``'s).

    ``exist_ok``: a release ``name`` that already froze this table version is returned as it is (a retried
    pipeline step); one that froze another version is still refused.
    """
    if allow_contamination is not None and not allow_contamination.strip():
        raise ReleaseError("--allow-contamination needs a reason (it is recorded in the release), e.g. "
                           '--allow-contamination "eval set is the held-out split, not the one we score on"')
    check_name(name)
    if exist_ok and release_exists(lake, name):
        return _the_same_release(lake, name, table=table, version=version, require_qa=require_qa,
                                 allow_contamination=allow_contamination)
    refuse_taken(lake, name)
    if not lake.exists(table):
        raise ReleaseError(f"{lake.table_uri(table)}: no table {table!r} to release; run a job first")
    latest = int(lake.table(table).version())
    if version is None:  # a re-run after a crash finishes the first try's version, not a newer one
        version = _half_created_version(lake, name, table)
    version = latest if version is None else version
    if not 0 <= version <= latest:
        raise ReleaseError(f"{table} has versions 0..{latest}; --version {version} does not exist")
    problem = not_of_samples(table, lake.dataset(table, version).schema.names, reads="a release freezes samples",
                             lake_ref=lake.ref)
    if problem is not None:
        raise ReleaseError(f"release {name!r} refused: {problem}")
    verdict = qa_verdict(lake, table=table, version=version)
    if verdict.ran and not verdict.passed:
        raise ReleaseError(
            f"release {name!r} refused: QA failed for {table} v{version}:\n{verdict.describe_failures()}\n"
            f"fix the data, re-run the pipeline, then QA its new version ({qa_command(lake, table=table)}), "
            "or release an earlier version with --version"
        )
    if not verdict.ran and require_qa:
        raise ReleaseError(
            f"release {name!r} refused: no QA results for {table} v{version} and --require-qa was given; "
            f"run the QA suites first: {qa_command(lake, table=table, version=version)}"
        )
    missing = [suite for suite in require_suites if suite not in verdict.suites]
    if verdict.ran and missing:
        raise ReleaseError(
            f"release {name!r} refused: no QA results of {', '.join(missing)} for {table} v{version} (suites that ran: "
            f"{', '.join(sorted(verdict.suites))}) and --require-qa asks for the table's default suites; run them: "
            f"{qa_command(lake, table=table, version=version)}"
        )
    refuse_other_allowance(lake, name, allow_contamination)  # before the eval-set check reads every row
    from datahub.evalset.check import contamination

    checked = rows_done(progress, "eval-set check", logged_rows(lake, table, version)) if progress else None
    with SortedRuns(NOTES, "sample_id") as notes:  # the contaminated ids stream to disk, not held
        hits = contamination_notes(notes, allow_contamination) if allow_contamination is not None else None
        found = contamination(lake, table=table, version=version, progress=checked, hits=hits or no_notes)
        if found.count and allow_contamination is None:
            raise ReleaseError(
                f"release {name!r} refused: {found.describe()}\n"
                "drop them with the decontaminate operator in the job (graph node `op: decontaminate`) and re-run "
                f"(every id, to the file IDS: `datahub evalset check --table {table} --version {version} --ids-out IDS "
                f"--lake {lake.ref}`), or "
                'release anyway with --allow-contamination "REASON" (recorded in the release and its lineage)'
            )
        registered = registered_digests(lake)  # one registered while the rows were read was not checked
        if registered != found.evalset_digests:
            raise EvalSetsChangedError(
                f"release {name!r} refused: the eval sets registered now ({', '.join(sorted(registered))}) are not "
                f"those {table} v{version} was checked against ({', '.join(sorted(found.evalset_digests)) or 'none'}): "
                "one was registered while its rows were checked. Nothing was written: run the same command again")
        allowed = allow_contamination if found.count else None
        details: dict[str, Any] = {"qa_suites": verdict.suites}
        if found.evalsets:
            details["contamination"] = {**found.as_dict(), "allowed": allowed}
        # --allow-contamination changes no row: freeze records it with the lineage (the contaminated samples' reasons)
        params = {"kind": "create", "table": table, "version": version}
        fix = "the first try's --version"
        frozen, frozen_version, excluded, dropped = exclude_redacted(lake, name, table=table, version=version,
                                                                     params=params, fix=fix, progress=progress)
        details.update(excluded)
        run_ids, jobs = history_runs(lake, table, version)
        return freeze(lake, name, table=frozen, version=frozen_version, kind="create",
                      qa_status=verdict.status, creator=creator, details=details,
                      released_notes=notes.merged() if allowed is not None else None,
                      allow_contamination=allow_contamination,
                      contamination_check=check_key(found.evalset_digests, found.ngram, found.matcher),
                      evalset_digests=found.evalset_digests,
                      extra_lineage=dropped, run_ids=run_ids, jobs=jobs, params=params, fix=fix, progress=progress)


def _the_same_release(lake: Lake, name: str, *, table: str, version: int | None, require_qa: bool,
                      allow_contamination: str | None) -> Release:
    """Release ``name`` when it is a ``create`` of ``table`` at ``version`` (default: the latest) that the gates
    asked for now would have let through, else refused."""
    if not lake.exists(table):
        raise ReleaseError(f"{lake.table_uri(table)}: no table {table!r} to release; run a job first")
    existing = get_release(lake, name)
    recorded = committed_params(lake, "lineage", name) or {}  # the version it froze, when materialized elsewhere
    frozen_table = recorded.get("table", existing.table)
    frozen_version = int(recorded.get("version", existing.version))
    asked = version if version is not None else int(lake.table(table).version())
    if existing.kind == "create" and (frozen_table, frozen_version) == (table, asked):
        if require_qa and existing.qa_status == "no_qa_results":
            raise ReleaseError(f"release {name!r} already exists but was created without QA results; --require-qa "
                               "cannot be satisfied by it: choose a new name")
        allowed = recorded.get("allow_contamination") or (existing.details.get("contamination") or {}).get("allowed")
        if allowed and allow_contamination is None:
            raise ReleaseError(f"release {name!r} already exists and was created with --allow-contamination "
                               f"{allowed!r} (its samples overlap an eval set); give the same to accept it, or choose "
                               "a new name")
        return existing
    if existing.kind != "create":  # no --version makes a create match a merge or a redact
        raise ReleaseError(f"release {name!r} already exists as a {existing.kind} release, not a create of {table} "
                           f"v{asked}; release names are immutable: choose a new name (e.g. bump the version suffix)")
    raise ReleaseError(f"release {name!r} already exists and froze {frozen_table} v{frozen_version}, not {table} v{asked} "
                       "as asked; release names are immutable: choose a new name (e.g. bump the version suffix), or "
                       "pass the --version it froze")


def _half_created_version(lake: Lake, name: str, table: str) -> int | None:
    """The version of ``table`` an earlier, crashed try of release ``name`` committed (lineage or the materialized
    table), or None."""
    for written in ("lineage", MATERIALIZED_PREFIX + name):
        recorded = committed_params(lake, written, name) if lake.exists(written) else None
        if recorded and recorded.get("kind") == "create" and recorded.get("table") == table:
            return int(recorded["version"])
    return None

"""``release.create``: freeze a Delta version of a table under an immutable name, QA-gated."""

from __future__ import annotations

from datahub.errors import ReleaseError
from datahub.lake.lake import Lake
from datahub.release.freeze import freeze, refuse_taken
from datahub.release.qa_gate import qa_command, qa_verdict
from datahub.release.records import Release, check_name


def create_release(
    lake: Lake,
    name: str,
    *,
    table: str = "samples",
    version: int | None = None,
    require_qa: bool = False,
    creator: str | None = None,
) -> Release:
    """Freeze ``table`` at ``version`` (default: latest) as release ``name``.

    Refused when the name exists, when the latest result of any QA suite for that version
    failed, or (with ``require_qa``) when no QA ran on it.
    """
    check_name(name)
    refuse_taken(lake, name)
    if not lake.exists(table):
        raise ReleaseError(f"{lake.table_uri(table)}: no table {table!r} to release; run a job first")
    latest = int(lake.table(table).version())
    version = latest if version is None else version
    if not 0 <= version <= latest:
        raise ReleaseError(f"{table} has versions 0..{latest}; --version {version} does not exist")
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
    ids = lake.read(table, version=version, columns=["sample_id"]).column("sample_id")
    return freeze(lake, name, table=table, version=version, sample_ids=ids, kind="create",
                  qa_status=verdict.status, creator=creator,
                  details={"qa_suites": verdict.suites})

"""``--release NAME`` beside ``--table``/``--version``: the table version a release froze (a merged or redacted
release lives in a table of its own, ``release_NAME``), for the commands that read one (qa, report, evalset check)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from datahub.errors import SpecError

if TYPE_CHECKING:
    from datahub.lake import Lake

RELEASE_HELP = "Read what this release froze (its table and version) instead of --table/--version."


def release_table(lake: Lake, release: str | None, table: str, version: int | None, *,
                  default_table: str = "samples") -> tuple[str, int | None]:
    """``(table, version)``: the release's when ``release`` is given (refused beside --table or --version), else as
    given."""
    if release is None:
        return table, version
    if version is not None or table != default_table:
        raise SpecError(f"--release {release} already fixes the table and version; drop --table and --version")
    from datahub.release import get_release

    frozen = get_release(lake, release)
    return frozen.table, frozen.version

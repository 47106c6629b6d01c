"""How every command opens its lake: ``--lake`` takes a root, or a lake YAML with storage options.

A lake on Ceph/S3 needs delta-rs storage options (endpoint, keys, conditional put). Passing
them on the command line would show secrets in ``ps``, and ambient ``AWS_*`` variables are
implicit, so ``--lake`` also accepts a YAML file, the same shape as a job spec's ``lake:``
section (a job spec itself works too)::

    root: s3://datahub/lake
    storage_options:
      AWS_ENDPOINT_URL: http://rgw.internal:7480
      AWS_ACCESS_KEY_ID: ${CEPH_KEY}          # ${VAR} / ${VAR:-default}, as in job specs
      AWS_SECRET_ACCESS_KEY: ${CEPH_SECRET}
      AWS_ALLOW_HTTP: "true"
      aws_conditional_put: etag
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from datahub.config.lake_file import LAKE_FILE_SUFFIXES, is_lake_file, load_lake_spec  # noqa: F401  (its home before)
from datahub.errors import SpecError

if TYPE_CHECKING:
    from datahub.lake.lake import Lake

LAKE_HELP = "Lake root (a path or s3://bucket/prefix), or a lake YAML with root + storage_options (or a job spec)."


LAKE_ARGUMENT_HELP = "Deprecated: pass the lake as --lake (still accepted here)."


def lake_ref(positional: str | None, option: str | None, *, command: str) -> str:
    """The lake a command was given: ``--lake`` (every command's convention) or, deprecated, the
    positional form some commands took first, which prints a note on stderr."""
    import sys

    if positional is not None and option is not None and positional != option:
        raise SpecError(f"datahub {command}: two lakes given ({positional!r} and --lake {option!r}); pass only --lake")
    ref = option if option is not None else positional
    if ref is None:
        raise SpecError(f"datahub {command}: no lake given; pass --lake ROOT (a path or s3://bucket/prefix) or --lake LAKE.yaml")
    if not ref.strip():
        raise SpecError(f"datahub {command}: --lake is empty; pass a path or s3://bucket/prefix (an unset variable?)")
    if option is None:
        sys.stderr.write(f"note: `datahub {command} LAKE` is deprecated and will be removed; "
                         f"use `datahub {command} --lake {ref}`\n")
    return ref


def open_lake(ref: str, *, storage_options: Mapping[str, str] | None = None, must_exist: bool = True) -> Lake:
    """The ``Lake`` a ``--lake`` value names; explicit ``storage_options`` win over the file's. A local root
    that does not exist is refused unless ``must_exist`` is false (a command that may start a lake): a typo
    in --lake must not read as an empty lake ("no runs", "nothing to move") to a script."""
    from datahub.lake import Lake

    from datahub.cli.arguments import given

    given(ref, "--lake", what="a lake root (a path or s3://bucket/prefix) or a lake YAML")  # not the current directory
    if not is_lake_file(ref):
        lake = Lake(ref, storage_options=storage_options)
    else:
        spec = load_lake_spec(ref)
        lake = Lake(spec.root, storage_options={**spec.storage_options, **(storage_options or {})})
        lake.ref = ref  # hints in messages name the file, so a pasted command gets the storage options too
    if must_exist and lake.is_local and not Path(lake.root.removeprefix("file://")).is_dir():
        raise SpecError(f"--lake {ref}: no lake at {lake.root} (no such directory); check the path "
                        "(a lake is made by `datahub run JOB.yaml`)")
    if must_exist and lake.is_local and not _holds_tables(Path(lake.root.removeprefix("file://"))):
        raise SpecError(f"--lake {ref}: no lake at {lake.root} (no Delta table in it)" + _lakes_under(ref, lake.root))
    return lake


def _holds_tables(root: Path) -> bool:
    """Whether ``root`` is a lake: it holds a Delta table (a child with a ``_delta_log``) or datahub's own state (a
    child named ``_...``, e.g. ``_leases``: a run killed before its first commit leaves only its lease, and
    ``datahub runs`` must show that run and how to resume it; ``Lake.tables`` skips such names the same way), or
    nothing at all (a lake-to-be: an empty directory reads as an empty lake, as before)."""
    if (root / "_delta_log").is_dir():  # a table itself (its _delta_log, _change_data are not a lake's state)
        return False
    try:
        children = [child for child in root.iterdir() if not _not_a_lakes(child.name)]
        return not children or _holds_state(children)  # empty: a lake-to-be, as before
    except OSError:  # unreadable: the command's own read says why
        return True


def _not_a_lakes(name: str) -> bool:
    """Names a fresh lake directory may hold that are not the lake's: hidden files (``.gitkeep``, ``.snapshot``)
    and a mount's ``lost+found``."""
    return name.startswith(".") or name == "lost+found"


def _holds_state(children: list[Path]) -> bool:
    """Whether any of a directory's ``children`` is a Delta table or datahub's own state (``_...``)."""
    return any(child.name.startswith("_") or (child / "_delta_log").is_dir() for child in children if child.is_dir())


def _lakes_under(ref: str, root: str) -> str:
    """The fix when ``root`` is a directory above lakes (`--lake lake` for the demo's ./lake/demo), or the path
    of a lake-to-be."""
    base = Path(root.removeprefix("file://"))
    if (base / "_delta_log").is_dir():  # `--lake lake/demo/samples`: one table of the lake
        parent = ref.rstrip("/").rsplit("/", 1)[0] if "/" in ref.rstrip("/") else "."
        return f"; it is the Delta table {base.name!r} of a lake: e.g. --lake {parent}"
    try:
        lakes = sorted(child.name for child in base.iterdir()  # holding tables or state: not any empty directory
                       if child.is_dir() and not _not_a_lakes(child.name) and not (child / "_delta_log").is_dir()
                       and _holds_state(list(child.iterdir())))
    except OSError:
        lakes = []
    if not lakes:
        return "; check the path (a lake is made by `datahub run JOB.yaml`)"
    listed = ", ".join(lakes[:5]) + (f" and {len(lakes) - 5} more" if len(lakes) > 5 else "")
    return f"; the lakes under it: {listed}: e.g. --lake {ref.rstrip('/')}/{lakes[0]}"


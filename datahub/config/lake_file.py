"""A lake YAML (``root:`` and ``storage_options:``, or a job spec's ``lake:`` section): what ``--lake LAKE.yaml``
takes in every command and ``lake=`` takes in the loader, read here below both (layers point down)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from datahub.errors import SpecError

if TYPE_CHECKING:
    from datahub.config.spec import LakeSpec

LAKE_FILE_SUFFIXES = (".yaml", ".yml")


def is_lake_file(ref: str) -> bool:
    """A local ``.yaml``/``.yml`` path names a lake file; anything else is a lake root."""
    return "://" not in ref and ref.endswith(LAKE_FILE_SUFFIXES)


def load_lake_spec(path: str | Path) -> LakeSpec:
    """The validated ``LakeSpec`` in a lake YAML (top level, or the ``lake:`` section of a job spec)."""
    from pydantic import ValidationError

    from datahub.config.spec import LakeSpec, expand_env, format_validation_error
    from datahub.config.yaml_file import read_yaml

    path = Path(path)
    raw = read_yaml(path, missing="lake file not found; --lake takes a lake root or a YAML with root: and storage_options:")
    section = ""
    if isinstance(raw, dict) and isinstance(raw.get("lake"), dict):
        raw, section = raw["lake"], "lake"  # a job spec (or any file with a lake: section)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping with root: (and storage_options:), got {type(raw).__name__}")
    if "tiers" in raw and "root" not in raw:  # --lake and --storage both take a YAML: an easy mix-up
        raise SpecError(f"{path}: a storage config (tiers:), not a lake; give it as --storage, and the lake as --lake "
                        "ROOT or a lake YAML with root: (and storage_options:)")
    raw = expand_env(raw, source=str(path), field=section)
    options = raw.get("storage_options")
    if isinstance(options, dict):  # YAML reads `AWS_ALLOW_HTTP: true` as a bool; delta-rs wants strings
        raw = {**raw, "storage_options": {k: _option_text(v) for k, v in options.items()}}
    try:
        return LakeSpec(**raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(str(path), exc)) from None


def _option_text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (int, float)) else value

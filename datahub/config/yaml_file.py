"""The one reader of YAML files (job specs, storage configs, lake files): errors name the file, the line
and column of a syntax error, and what to do."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from datahub.errors import SpecError


def read_yaml(path: str | os.PathLike[str], *, missing: str) -> Any:
    """The parsed YAML at ``path``; ``missing`` completes the message for a file that does not exist."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text()
    except FileNotFoundError:
        raise SpecError(f"{source}: {missing}") from None
    except OSError as exc:
        raise SpecError(f"{source}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise SpecError(f"{source}:{where} not valid YAML: {getattr(exc, 'problem', None) or exc}") from None

"""The core packages type-check with mypy (STYLE.md), as `make lint` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors_in_datahub() -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "datahub"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout

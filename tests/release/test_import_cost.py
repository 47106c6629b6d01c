"""The release package (imported by export and the CLI) does not load pandas: that cost 0.3-0.9 s of start-up."""

from __future__ import annotations

import subprocess
import sys


def test_importing_release_and_export_does_not_load_pandas() -> None:
    code = ("import sys, datahub.release, datahub.export; "
            "print(sorted(m for m in ('pandas', 'pyarrow.dataset') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

"""Scratch folders of exports (datahub.export.scratch): a killed export's are swept by the next export, a running
one's and an older datahub's (no lock file) are left alone."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from datahub.export import export_table_version
from datahub.export.scratch import EXPORT_PREFIX, LOCK_NAME, scratch_dir, sweep_stale
from tests.export.helpers import cfs_storage, make_lake

KILLED = """
import os, sys
from datahub.export.scratch import scratch_dir
with scratch_dir("datahub-export-", parent=sys.argv[1]) as path:
    open(os.path.join(path, "run-000000.arrow"), "wb").write(b"runs")
    print(path, flush=True)
    os.kill(os.getpid(), 9)
"""


def test_an_export_sweeps_killed_exports_folders_and_spares_running_ones(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    killed = subprocess.run([sys.executable, "-c", KILLED, str(spill)], capture_output=True, text=True,
                            cwd=Path(__file__).parents[2])
    assert killed.returncode == -9, killed.stderr
    stale = Path(killed.stdout.strip())
    assert stale.name.startswith(EXPORT_PREFIX) and (stale / "run-000000.arrow").exists()
    older = spill / f"{EXPORT_PREFIX}older"  # an older datahub's: no lock file, nothing tells whether it runs
    older.mkdir()
    (spill / f"{EXPORT_PREFIX}file").write_text("not a folder")
    with scratch_dir(EXPORT_PREFIX, parent=str(spill)) as running:
        assert (Path(running) / LOCK_NAME).exists()
        with open(Path(running) / LOCK_NAME, "rb") as handle:  # held by the block: another open cannot take it
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("a running export's folder is unlocked")
            except BlockingIOError:
                pass
        lake, version = make_lake(tmp_path / "lake", 30)
        export_table_version(lake, table="samples", version=version, release_name="r", tier="cfs",
                             storage=cfs_storage(("cfs", tmp_path / "cfs")), shard_samples=10, spill_dir=str(spill))
        assert not stale.exists() and Path(running).is_dir() and older.is_dir()
        assert sorted(os.listdir(spill)) == sorted([Path(running).name, older.name, f"{EXPORT_PREFIX}file"])
    assert not Path(running).exists()
    assert sweep_stale(EXPORT_PREFIX, parent=str(spill)) == [] and older.is_dir()

"""`datahub export` options that only mean something beside others are refused alone, never dropped: before,
`export r1 --version 0` exported the version release r1 froze (exit 0), and `--address ray://...` without
`--engine ray` exported in this process while the user thought a cluster did it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import datahub
from tests.cli.test_clean_errors import assert_clean_error


@pytest.fixture(scope="module")
def released(small_lake) -> tuple[Path, Path, Path]:
    """The small lake with release r1 (samples v1), and a storage YAML with one cfs tier (not written yet)."""
    from datahub.lake import Lake
    from datahub.release import create_release

    create_release(Lake(str(small_lake)), "r1")
    tier = small_lake.parent / "cfs"
    storage = small_lake.parent / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tier}\n")
    return small_lake, storage, tier


@pytest.mark.parametrize("extra, expected", [
    (["--version", "0"], ["--version 0 goes with --table", "release 'r1' already froze its table version",
                          "--table samples --version 0"]),
    (["--address", "ray://head:10001"], ["--address ray://head:10001 names a cluster, but --engine is local",
                                         "add --engine ray"]),
    (["--workers", "4"], ["--workers 4 sets how many engine tasks", "add --engine ray or --engine spark"]),
    (["--object-store-mb", "512"], ["--object-store-mb 512 sizes the embedded Ray", "drop --object-store-mb"]),
    (["--engine", "ray", "--address", "ray://head:10001", "--object-store-mb", "512"],
     ["--object-store-mb 512", "set on the cluster"]),
])
def test_an_option_the_others_make_meaningless_is_refused_before_anything_is_written(released, extra, expected):
    lake, storage, tier = released
    out = datahub("export", "r1", "--lake", str(lake), "--tier", "cfs", "--storage", str(storage), *extra)
    assert_clean_error(out, *expected)
    assert not tier.exists(), sorted(tier.rglob("*"))


def test_a_tier_endpoint_nothing_answers_on_is_one_line_naming_it(released, tmp_path, monkeypatch):
    """An export to a ceph tier whose RGW is down (or a mistyped port) ended in a 180-line botocore/aiohttp
    traceback, exit 1."""
    lake, _, _ = released
    storage = tmp_path / "ceph.yaml"
    storage.write_text("tiers:\n  ceph:\n    kind: ceph\n    endpoint_url: http://127.0.0.1:9\n    bucket: datahub\n"
                       "    credentials: {key_env: UXA_KEY, secret_env: UXA_SECRET}\n")
    monkeypatch.setenv("UXA_KEY", "key")  # the subprocess inherits them
    monkeypatch.setenv("UXA_SECRET", "secret")
    out = datahub("export", "r1", "--lake", str(lake), "--tier", "ceph", "--storage", str(storage))
    assert_clean_error(out, f"{storage}: tiers.ceph.endpoint_url http://127.0.0.1:9: nothing answers (",
                       "that the RGW (radosgw) runs")


def test_version_with_table_still_exports_that_version(released):
    lake, storage, tier = released
    out = datahub("export", "v1-copy", "--lake", str(lake), "--tier", "cfs", "--storage", str(storage),
                  "--table", "samples", "--version", "1", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"table_version": 1' in out.stdout

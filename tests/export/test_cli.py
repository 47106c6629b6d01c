"""`datahub export` and `datahub tier plan|apply` through the CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from datahub.cli.main import app
from tests.export.helpers import make_lake


def test_export_then_tier_plan_and_apply(tmp_path) -> None:
    make_lake(tmp_path / "lake", 40)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n"
                       f"  cfs2:\n    kind: cfs\n    path: {tmp_path / 'cfs2'}\n")
    runner = CliRunner()
    out = runner.invoke(app, ["export", "r1", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(storage),
                              "--table", "samples", "--shard-samples", "15", "--json"])
    assert out.exit_code == 0, out.output
    manifest = json.loads(out.stdout)
    assert [s["samples"] for s in manifest["shards"]] == [15, 15, 10]
    args = ["--lake", str(tmp_path / "lake"), "--storage", str(storage), "--release", "r1", "--tiers", "cfs2", "--json"]
    plan = json.loads(runner.invoke(app, ["tier", "plan", *args]).stdout)
    assert [(m["action"], m["tier"]) for m in plan["moves"]] == [("copy", "cfs2"), ("delete", "cfs")]
    assert plan["bytes_to_copy"] == sum(s["size"] for s in manifest["shards"])
    assert (tmp_path / "cfs/r1").exists()  # plan is a dry run
    assert runner.invoke(app, ["tier", "apply", *args]).exit_code == 0
    assert not (tmp_path / "cfs/r1").exists() and (tmp_path / "cfs2/r1/r1-000002.tar").exists()
    assert json.loads(runner.invoke(app, ["tier", "apply", *args]).stdout)["moves"] == []

    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers:\n  cfs:\n    kind: cfs\n    mount: /mnt/cfs\n")
    failed = runner.invoke(app, ["export", "r2", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(bad),
                                 "--table", "samples"])
    assert failed.exit_code != 0 and "tiers.cfs.path" in str(failed.exception)


def test_relative_cfs_path_resolves_against_the_working_directory(tmp_path, monkeypatch) -> None:
    """Like a job spec's lake root, a relative tier path is taken from the current directory."""
    from datahub.storage import load_storage_config

    storage = tmp_path / "storage.yaml"
    storage.write_text("tiers:\n  cfs:\n    kind: cfs\n    path: ./shards/hot\n")
    monkeypatch.chdir(tmp_path)
    assert load_storage_config(storage).tiers["cfs"].path == str(tmp_path / "shards" / "hot")


def _tar_samples(path) -> list[tuple[str, int]]:
    """(key, bytes the sample takes in the tar: headers + padded data) in archive order."""
    import tarfile

    out: list[tuple[str, int]] = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.name == "__index__":
                continue
            key = member.name.split(".", 1)[0]
            size = 512 + -(-member.size // 512) * 512
            if out and out[-1][0] == key:
                out[-1] = (key, out[-1][1] + size)
            else:
                out.append((key, size))
    return out


def _storage_yaml(path, **tiers) -> str:
    path.write_text("tiers:\n" + "".join(f"  {name}:\n    kind: cfs\n    path: {where}\n" for name, where in tiers.items()))
    return str(path)


def test_export_a_release_by_name_with_a_shard_size(tmp_path) -> None:
    """`export RELEASE` resolves a real `release create`; --shard-size 40KB bounds every whole shard file."""
    import tarfile

    from datahub.export.export import index_reserve
    from datahub.shards.tar import RECORD

    lake = str(tmp_path / "lake")
    make_lake(lake, 120)
    storage = _storage_yaml(tmp_path / "storage.yaml", cfs=tmp_path / "cfs")
    runner = CliRunner()
    created = runner.invoke(app, ["release", "create", "corpus-v1", "--lake", lake, "--json"])
    assert created.exit_code == 0, created.output
    release = json.loads(created.stdout)
    out = runner.invoke(app, ["export", "corpus-v1", "--lake", lake, "--tier", "cfs", "--storage", storage,
                              "--shard-size", "40KB", "--json"])
    assert out.exit_code == 0, out.output
    manifest = json.loads(out.stdout)
    assert (manifest["table"], manifest["table_version"], manifest["release_digest"]) == (
        release["table"], release["version"], release["digest"])
    shards = manifest["shards"]
    assert len(shards) >= 3 and sum(s["samples"] for s in shards) == 120
    budget = 40_000 // RECORD * RECORD  # whole records that fit in 40 KB
    samples = [_tar_samples(tmp_path / "cfs/corpus-v1" / s["name"]) for s in shards]
    for i, shard in enumerate(shards):
        assert shard["size"] <= 40_000 and shard["size"] % RECORD == 0
        assert len(samples[i]) == shard["samples"]
        if i + 1 < len(shards):  # full: the next shard's first sample, with its index bytes, would not have fit
            members = sum(size for _, size in samples[i]) + samples[i + 1][0][1]
            assert members + index_reserve(members, len(samples[i]) + 1) + 1024 > budget
    with tarfile.open(tmp_path / "cfs/corpus-v1" / shards[0]["name"]) as tar:
        names = tar.getnames()
        assert names[:2] == [f"{samples[0][0][0]}.txt", f"{samples[0][0][0]}.json"]
        assert names[-1] == "__index__"  # the embedded index (datahub.shards.index), last


def test_shuffle_seed_orders_samples_reproducibly(tmp_path) -> None:
    runner = CliRunner()
    for name in ("a", "b"):
        make_lake(tmp_path / f"lake-{name}", 60)
    storage = _storage_yaml(tmp_path / "storage.yaml", cfs=tmp_path / "cfs", cfs2=tmp_path / "cfs2")

    def export(lake: str, release: str, tier: str, *seed: str) -> dict:
        out = runner.invoke(app, ["export", release, "--lake", str(tmp_path / lake), "--tier", tier, "--storage", storage,
                                  "--table", "samples", "--shard-samples", "25", *seed, "--json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    def keys(tier: str, manifest: dict) -> list[str]:
        return [k for s in manifest["shards"] for k, _ in _tar_samples(tmp_path / tier / manifest["release"] / s["name"])]

    first = export("lake-a", "mix", "cfs", "--shuffle-seed", "7")
    again = export("lake-b", "mix", "cfs2", "--shuffle-seed", "7")  # same data and seed, another lake and tier
    for x, y in zip(first["shards"], again["shards"], strict=True):
        assert (tmp_path / "cfs/mix" / x["name"]).read_bytes() == (tmp_path / "cfs2/mix" / y["name"]).read_bytes()
    other = export("lake-a", "mix8", "cfs", "--shuffle-seed", "8")
    plain = export("lake-a", "plain", "cfs")
    seven, eight, unshuffled = keys("cfs", first), keys("cfs", other), keys("cfs", plain)
    assert sorted(seven) == sorted(eight) == unshuffled == sorted(unshuffled) and len(seven) == 60
    assert seven != eight and seven != unshuffled
    assert [s["sha256"] for s in first["shards"]] != [s["sha256"] for s in other["shards"]]


def test_tier_plan_apply_across_regions_with_two_storage_files(tmp_path) -> None:
    lake = str(tmp_path / "lake")
    make_lake(lake, 30)
    home = _storage_yaml(tmp_path / "home.yaml", cfs=tmp_path / "cfs")
    eu = _storage_yaml(tmp_path / "eu.yaml", **{"cfs-eu": tmp_path / "eu"})
    runner = CliRunner()
    assert runner.invoke(app, ["export", "r1", "--lake", lake, "--tier", "cfs", "--storage", home, "--table", "samples",
                               "--shard-samples", "12"]).exit_code == 0
    args = ["--lake", lake, "--storage", home, "--storage", eu, "--release", "r1", "--tiers", "cfs,cfs-eu", "--json"]
    plan = json.loads(runner.invoke(app, ["tier", "plan", *args]).stdout)
    assert [(m["action"], m["source"], m["tier"]) for m in plan["moves"]] == [("copy", "cfs", "cfs-eu")]
    assert not (tmp_path / "eu").exists()
    applied = runner.invoke(app, ["tier", "apply", *args])
    assert applied.exit_code == 0, applied.output
    manifest = json.loads((tmp_path / "lake/_exports/r1/manifest.json").read_text())
    assert [sorted(s["replicas"]) for s in manifest["shards"]] == [["cfs", "cfs-eu"]] * 3
    for shard in manifest["shards"]:
        assert open(shard["replicas"]["cfs-eu"], "rb").read() == open(shard["replicas"]["cfs"], "rb").read()
    assert json.loads((tmp_path / "eu/r1/manifest.json").read_text()) == manifest
    assert json.loads(runner.invoke(app, ["tier", "apply", *args]).stdout)["moves"] == []

    # the eu region alone cannot see the release's only other replica: drop home, keep eu (policy off, explicit)
    moved = runner.invoke(app, ["tier", "apply", "--lake", lake, "--storage", home, "--storage", eu, "--release", "r1",
                                "--tiers", "cfs-eu", "--json"])
    assert moved.exit_code == 0, moved.output
    assert not (tmp_path / "cfs/r1").exists() and (tmp_path / "eu/r1/r1-000002.tar").exists()
    clash = runner.invoke(app, ["tier", "plan", "--lake", lake, "--storage", home, "--storage", home])
    assert clash.exit_code != 0 and "also defined in" in str(clash.exception)


def test_ray_export_caps_the_embedded_object_store_unless_given_an_address(tmp_path, monkeypatch) -> None:
    import datahub.engines.registry as registry
    from datahub.cli.commands.export import EMBEDDED_RAY_STORE_MB

    make_lake(tmp_path / "lake", 10)
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    specs = []

    class Stop(Exception):
        pass

    def make_engine(spec):
        specs.append(spec)
        raise Stop  # the spec is what this test checks; no Ray is started

    monkeypatch.setattr(registry, "make_engine", make_engine)
    base = ["export", "r1", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(storage),
            "--table", "samples", "--engine", "ray"]
    for extra in ([], ["--object-store-mb", "1024"], ["--address", "ray://head:10001"]):
        assert isinstance(CliRunner().invoke(app, [*base, *extra]).exception, Stop)
    assert [s.object_store_mb for s in specs] == [EMBEDDED_RAY_STORE_MB, 1024, None]
    assert specs[2].address == "ray://head:10001"

"""`datahub tier apply` copies a release's token files (``.bin``/``.idx``/``.ids``) with its text shards: streamed,
sha256-verified, resumable after SIGKILL, the token manifest and lineage updated so the loader reads them on the new
tier. Two cfs tiers here; the real Ceph RGW in test_token_tiering_ceph.py; removal from a tier the release leaves
in test_token_removal.py."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datahub.export import export_table_version, read_lake_manifest
from datahub.export.tiering import apply_tiers, plan_tiers
from datahub.export.tokens import export_table_tokens
from datahub.lake import Lake
from datahub.pipeline.faults import KILL_AT_ENV
from datahub.shards.token_manifest import TokenManifest, read_lake_token_manifest, read_tier_token_manifest
from datahub.storage import StorageConfig, validate_storage_config
from tests.export.test_tokens import make_lake, train_tokenizer

REPO = Path(__file__).resolve().parents[2]
PARTS = ("bin", "idx", "ids")


def _storage(tmp_path: Path, *tiers: str) -> tuple[StorageConfig, Path]:
    raw = {"tiers": {name: {"kind": "cfs", "path": str(tmp_path / name)} for name in tiers}}
    path = tmp_path / f"storage-{'-'.join(tiers)}.yaml"
    path.write_text("tiers:\n" + "".join(f"  {name}:\n    kind: cfs\n    path: {tmp_path / name}\n" for name in tiers))
    return validate_storage_config(raw, source=str(path)), path


def _exported(tmp_path: Path, storage: StorageConfig, tier: str = "hot") -> tuple[Lake, TokenManifest]:
    lake, version = make_lake(tmp_path / "lake", 90)
    export_table_version(lake, table="samples", version=version, release_name="r", tier=tier, storage=storage,
                         shard_samples=30)
    tokens = export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                                 tokenizer=train_tokenizer(tmp_path / "tok.json"), tier=tier, file_tokens=300)
    assert len(tokens.files) >= 3
    return lake, tokens


def _documents(manifest: TokenManifest, tier: str, verdicts: Path) -> list[tuple[str, list[int]]]:
    """Every document (sample id, tokens) as the loader's token reader opens them on ``tier`` only."""
    from datahub.loader.token_replicas import open_replicas

    documents = []
    for record, files in zip(manifest.files, open_replicas(manifest.files, [tier], verify="always",
                                                           verdicts_dir=verdicts)):
        assert files.prefix == record.replicas[tier]
        ids = files.sample_ids.to_pylist()
        documents += [(ids[d], np.asarray(files[d]).tolist()) for d in range(files.num_documents)]
    return documents


def _exported_lineage(lake: Lake, tier: str) -> list[tuple[str, str]]:
    table = lake.read("lineage")
    rows = zip(table["sample_id"].to_pylist(), table["action"].to_pylist(), table["ref"].to_pylist())
    return sorted((sample_id, ref) for sample_id, action, ref in rows
                  if action == "exported" and '"tokens"' in (ref or "") and f'"tier": "{tier}"' in ref)


def test_tier_apply_copies_token_files_and_the_loader_reads_them_there(tmp_path) -> None:
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    total = sum(record.part(p).size for record in tokens.files for p in PARTS)
    hot_bytes = {(i, part): Path(f"{record.replicas['hot']}.{part}").read_bytes()
                 for i, record in enumerate(tokens.files) for part in PARTS}
    hot_documents = _documents(tokens, "hot", tmp_path / "verdicts")
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cold"]})
    assert [(m.action, m.tier, m.token_files, m.token_bytes) for m in plan.moves] == [
        ("copy", "cold", len(tokens.files), total), ("delete", "hot", len(tokens.files), total)]
    assert plan.bytes_to_copy == plan.moves[0].bytes + total
    assert len(apply_tiers(lake, plan, storage=storage)) == 2
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["cold"]  # the delete took the token files too (test_token_removal.py)
    assert read_lake_manifest(lake, "r").tiers == ["cold"]
    assert read_tier_token_manifest(storage.tier("cold"), "r", tokens.tokenizer.sha256) == moved
    assert read_tier_token_manifest(storage.tier("hot"), "r", tokens.tokenizer.sha256) is None
    for i, after in enumerate(moved.files):
        assert list(after.replicas) == ["cold"] and after.replicas["cold"].startswith(str(tmp_path / "cold"))
        for part in PARTS:
            data = Path(f"{after.replicas['cold']}.{part}").read_bytes()
            assert data == hot_bytes[i, part]
            assert hashlib.sha256(data).hexdigest() == after.part(part).sha256
    assert _documents(moved, "cold", tmp_path / "verdicts") == hot_documents
    # the new tier's lineage: one exported event per document, as a token export to that tier writes it
    hot, cold = _exported_lineage(lake, "hot"), _exported_lineage(lake, "cold")
    assert len(cold) == len(hot) == tokens.num_documents
    assert [ref.replace(str(tmp_path / "cold"), "X").replace('"cold"', '"T"') for _, ref in cold] == \
        [ref.replace(str(tmp_path / "hot"), "X").replace('"hot"', '"T"') for _, ref in hot]
    assert plan_tiers(lake, storage=storage, targets={"r": ["cold"]}).moves == ()
    # a token export to the new tier now finds it done
    again = export_table_tokens(lake, table="samples", version=tokens.table_version, release_name="r", storage=storage,
                                tokenizer=tmp_path / "tok.json", tier="cold", file_tokens=300)
    assert again == moved


def test_token_files_exported_after_the_text_copy_follow_it(tmp_path) -> None:
    """The text is on both tiers already; a token export to one of them is copied to the other."""
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, version = make_lake(tmp_path / "lake", 90)
    export_table_version(lake, table="samples", version=version, release_name="r", tier="hot", storage=storage,
                         shard_samples=30)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}), storage=storage)
    tokens = export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                                 tokenizer=train_tokenizer(tmp_path / "tok.json"), tier="hot", file_tokens=300)
    plan = plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]})
    assert [(m.action, m.tier, m.source, m.shards, m.token_files) for m in plan.moves] == [
        ("copy", "cold", "hot", 0, len(tokens.files))]
    apply_tiers(lake, plan, storage=storage)
    assert read_lake_token_manifest(lake, "r").tiers == ["cold", "hot"]
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}).moves == ()


def test_a_damaged_token_replica_is_not_copied(tmp_path) -> None:
    """The only replica of a .bin no longer matches the manifest: nothing is published on the new tier, no
    manifest names it, and the error names the file."""
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    damaged = Path(f"{tokens.files[1].replicas['hot']}.bin")
    damaged.write_bytes(damaged.read_bytes()[::-1])
    with pytest.raises(Exception, match=f"no intact replica of token file {tokens.files[1].prefix}.bin"):
        apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}), storage=storage)
    assert not Path(tokens.files[1].replicas["hot"].replace(str(tmp_path / "hot"), str(tmp_path / "cold")) + ".bin").exists()
    assert read_lake_token_manifest(lake, "r") == tokens
    assert not list((tmp_path / "cold").rglob("*.partial-*"))


def _tier_apply(tmp_path: Path, storage: Path, tiers: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", "tier", "apply", "--lake", str(tmp_path / "lake"),
                           "--storage", str(storage), "--release", "r", "--tiers", tiers, "--json"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO, check=False)


def test_a_killed_token_copy_resumes_keeping_the_files_it_copied(tmp_path) -> None:
    """SIGKILL after the second token file landed on the new tier: no manifest names the tier's token files; the
    re-run keeps files 0-1 (not copied again), copies the rest, and the loader reads them all there."""
    storage, storage_yaml = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    killed = _tier_apply(tmp_path, storage_yaml, "hot,cold", kill_at="tier:after_token_file:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert read_lake_manifest(lake, "r").tiers == ["cold", "hot"]  # the text copy finished before the tokens
    assert read_lake_token_manifest(lake, "r") == tokens
    folder = tmp_path / "cold" / "r" / f"tokens-{tokens.tokenizer.sha256[:12]}"
    kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("r-00000[01].*")}
    assert len(kept) == 6 and not (folder / "tokens-manifest.json").exists()
    resumed = _tier_apply(tmp_path, storage_yaml, "hot,cold")
    assert resumed.returncode == 0, resumed.stderr
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("r-00000[01].*")} == kept
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["cold", "hot"]
    assert _documents(moved, "cold", tmp_path / "verdicts") == _documents(tokens, "hot", tmp_path / "verdicts")
    assert len(_exported_lineage(lake, "cold")) == tokens.num_documents
    assert not list(folder.glob(".*partial*"))
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}).moves == ()


def test_a_damaged_token_replica_on_a_tier_is_copied_again(tmp_path) -> None:
    """A replica the manifest names lost bytes (size: every plan sees it) or had a byte flipped (same size: seen with
    verify, as text shards): apply copies that file again from an intact replica."""
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}), storage=storage)
    copied = read_lake_token_manifest(lake, "r")
    truncated, flipped = Path(f"{copied.files[0].replicas['cold']}.idx"), Path(f"{copied.files[2].replicas['cold']}.bin")
    truncated.write_bytes(truncated.read_bytes()[:-1])
    data = bytearray(flipped.read_bytes())
    data[0] ^= 1
    flipped.write_bytes(bytes(data))
    plan = plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]})
    assert [(m.action, m.tier, m.source, m.shards, m.token_files) for m in plan.moves] == [("copy", "cold", "hot", 0, 1)]
    apply_tiers(lake, plan, storage=storage)
    assert truncated.read_bytes() == Path(f"{copied.files[0].replicas['hot']}.idx").read_bytes()
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}).moves == ()  # by size only
    plan = plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}, verify=True)
    assert [(m.action, m.tier, m.token_files, m.verify) for m in plan.moves] == [("copy", "cold", 1, True)]
    apply_tiers(lake, plan, storage=storage)
    assert flipped.read_bytes() == Path(f"{copied.files[2].replicas['hot']}.bin").read_bytes()
    assert read_lake_token_manifest(lake, "r") == copied
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}, verify=True).moves == ()

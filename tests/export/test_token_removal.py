"""`datahub tier apply` removes a release's token files from a tier it moves the release's text off: only once every
file has another replica verified (size and sha256) on a configured tier, the token manifests first (tier copies,
then the lake's: readers move off), then the text manifest, the bytes last; resumable after SIGKILL at any step, and
the loader never picks a removed replica. A token-only replica (token files exported on purpose to a tier that never
held the text) is kept by policy runs, apply after apply; `tier apply --tiers` (the whole placement) removes one on a
tier it does not list, the same verified way. Two or three cfs tiers here; the real Ceph RGW, across regions, in
test_token_removal_ceph.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from datahub.errors import IntegrityError
from datahub.export import export_table_version, read_lake_manifest
from datahub.export.tiering import apply_tiers, plan_tiers
from datahub.export.tokens import export_table_tokens
from datahub.lake import Lake
from datahub.shards.token_manifest import TokenManifest, read_lake_token_manifest, read_tier_token_manifest, token_dir
from datahub.storage import StorageConfig
from tests.export.test_token_tiering import PARTS, REPO, _exported, _storage, _tier_apply
from tests.export.test_tokens import make_lake, train_tokenizer


def lake_tokens_path(tmp_path: Path, manifest: TokenManifest) -> Path:
    return tmp_path / "lake" / "_exports" / "r" / f"{token_dir(manifest.tokenizer.sha256)}.json"


def packed_tokens(path: Path, tiers: list[str]) -> Counter[int]:
    """Every real token a PackedDataset reads from the token manifest at ``path`` (tiers in this order)."""
    from datahub.loader.packing import PackedDataset

    dataset = PackedDataset(str(path), seq_len=16, batch_size=4, shuffle=False, tier_preference=tiers,
                            verify="always")
    seen: Counter[int] = Counter()
    for batch in dataset:
        seen.update(np.asarray(batch["tokens"])[np.asarray(batch["loss_mask"])].tolist())
    return seen


def named_replicas_intact(lake: Lake, storage: StorageConfig) -> bool:
    """Every replica the lake's token manifest names has all its parts, at the manifest's sizes: what the loader
    may pick."""
    manifest = read_lake_token_manifest(lake, "r")
    assert manifest is not None
    return all(storage.tier(tier).size(f"{uri}.{part}") == record.part(part).size
               for record in manifest.files for tier, uri in record.replicas.items() for part in PARTS)


def test_moving_a_release_off_a_tier_removes_its_token_files_there(tmp_path) -> None:
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot"])
    token_bytes = sum(record.part(p).size for record in tokens.files for p in PARTS)
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cold"]})
    assert [(m.action, m.tier, m.token_files, m.token_bytes) for m in plan.moves] == [
        ("copy", "cold", len(tokens.files), token_bytes), ("delete", "hot", len(tokens.files), token_bytes)]
    assert plan.bytes_to_delete == plan.moves[1].bytes + token_bytes
    assert len(apply_tiers(lake, plan, storage=storage)) == 2
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["cold"] and all(set(r.replicas) == {"cold"} for r in moved.files)
    assert read_tier_token_manifest(storage.tier("cold"), "r", tokens.tokenizer.sha256) == moved
    assert read_lake_manifest(lake, "r").tiers == ["cold"]
    assert not (tmp_path / "hot" / "r").exists()
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot", "cold"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["cold"]}).moves == ()


def test_token_files_are_not_removed_without_a_verified_replica_elsewhere(tmp_path) -> None:
    """The tier the release stays on holds a token file whose .bin had a byte flipped (same size: only the sha256
    tells): the delete refuses before changing anything, naming the file; an apply with --verify repairs it first."""
    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot"])
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}), storage=storage)
    both = read_lake_token_manifest(lake, "r")
    flipped = Path(f"{both.files[1].replicas['cold']}.bin")
    data = bytearray(flipped.read_bytes())
    data[0] ^= 1
    flipped.write_bytes(bytes(data))
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cold"]})  # by size: the flip is not seen
    assert [(m.action, m.tier) for m in plan.moves] == [("delete", "hot")]
    with pytest.raises(IntegrityError, match=f"token file {both.files[1].prefix}.*cold.*--verify"):
        apply_tiers(lake, plan, storage=storage)
    assert read_lake_token_manifest(lake, "r") == both and read_lake_manifest(lake, "r").tiers == ["cold", "hot"]
    assert named_replicas_intact(lake, storage) and (tmp_path / "hot" / "r").exists()
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cold"]}, verify=True)
    assert [(m.action, m.tier, m.token_files) for m in plan.moves] == [
        ("copy", "cold", 1), ("delete", "hot", len(tokens.files))]
    apply_tiers(lake, plan, storage=storage)
    assert read_lake_token_manifest(lake, "r").tiers == ["cold"] and not (tmp_path / "hot" / "r").exists()
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["cold"]) == expected


def split_export(tmp_path: Path, storage: StorageConfig, *, text: str, tokens: str) -> tuple[Lake, TokenManifest]:
    """The text exported to tier ``text``, the token files to tier ``tokens`` only."""
    lake, version = make_lake(tmp_path / "lake", 90)
    export_table_version(lake, table="samples", version=version, release_name="r", tier=text, storage=storage,
                         shard_samples=30)
    manifest = export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                                   tokenizer=train_tokenizer(tmp_path / "tok.json"), tier=tokens, file_tokens=300)
    assert len(manifest.files) >= 3 and read_lake_manifest(lake, "r").tiers == [text]
    return lake, manifest


def tier_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def policy_apply(tmp_path: Path, storage_yaml: Path) -> subprocess.CompletedProcess[str]:
    """`datahub tier apply --release r --json` without --tiers: the storage YAML's policy places the release."""
    return subprocess.run([sys.executable, "-m", "datahub.cli.main", "tier", "apply", "--lake", str(tmp_path / "lake"),
                           "--storage", str(storage_yaml), "--release", "r", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)


def test_token_files_exported_to_a_tier_without_the_text_are_kept_there(tmp_path) -> None:
    """Text on 'hot'; token files exported on purpose to 'packed', a cfs tier that never held the text (so that
    PackedDataset memory-maps them there). `tier apply` by the policy (every class on 'hot'; no --tiers, as cron
    runs it), twice: the token files are copied to the release's tier and stay on 'packed' (files and manifest), and
    PackedDataset reads every token there. Before 06ccfe4, the first apply copied them, then removed them from
    'packed' as the leftover of a delete."""
    storage, storage_yaml = _storage(tmp_path, "hot", "packed")
    with storage_yaml.open("a") as out:
        out.write("policy:\n  classes: {hot: [hot], warm: [hot], cold: [hot]}\n")
    lake, tokens = split_export(tmp_path, storage, text="hot", tokens="packed")
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"])
    before = tier_files(tmp_path / "packed")
    runs = [policy_apply(tmp_path, storage_yaml) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert [[(m["action"], m["tier"], m["token_files"]) for m in json.loads(run.stdout)["moves"]] for run in runs] == [
        [("copy", "hot", len(tokens.files))], []]
    token_bytes = sum(record.part(p).size for record in tokens.files for p in PARTS)
    assert [json.loads(run.stdout)["kept_token_only"] for run in runs] == [
        [{"release": "r", "tier": "packed", "token_files": len(tokens.files), "token_bytes": token_bytes}]] * 2
    shown = subprocess.run([sys.executable, "-m", "datahub.cli.main", "tier", "plan", "--lake", str(tmp_path / "lake"),
                            "--storage", str(storage_yaml), "--release", "r"],
                           capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert (f"r: kept {len(tokens.files)} token files, {token_bytes} bytes on packed (a token-only replica; `tier "
            "apply --release r --tiers ...` without packed removes them)") in " ".join(shown.stdout.split())
    kept = read_lake_token_manifest(lake, "r")
    assert kept is not None and kept.tiers == ["hot", "packed"]
    assert all(set(record.replicas) == {"hot", "packed"} for record in kept.files)
    assert read_tier_token_manifest(storage.tier("packed"), "r", tokens.tokenizer.sha256) == kept
    assert named_replicas_intact(lake, storage) and read_lake_manifest(lake, "r").tiers == ["hot"]
    after = tier_files(tmp_path / "packed")  # the token files untouched; only their manifest names 'hot' too
    manifest_name = f"r/{token_dir(tokens.tokenizer.sha256)}/tokens-manifest.json"
    assert {k: v for k, v in after.items() if k != manifest_name} == {k: v for k, v in before.items()
                                                                       if k != manifest_name}
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot"]}).moves == ()  # the API keeps it by default


def test_tier_apply_with_tiers_removes_a_token_only_replica_on_a_tier_not_listed(tmp_path) -> None:
    """`tier apply --tiers hot` states the release's whole placement: the token-only replica on 'packed' is copied
    to 'hot' and then removed from 'packed' (each file verified on 'hot' first; `tier plan` shows the delete with
    its token files and bytes); PackedDataset reads every token from 'hot'. Before, it stayed on 'packed' for ever:
    no command removed it."""
    storage, storage_yaml = _storage(tmp_path, "hot", "packed")
    lake, tokens = split_export(tmp_path, storage, text="hot", tokens="packed")
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"])
    token_bytes = sum(record.part(p).size for record in tokens.files for p in PARTS)
    shown = subprocess.run([sys.executable, "-m", "datahub.cli.main", "tier", "plan", "--lake", str(tmp_path / "lake"),
                            "--storage", str(storage_yaml), "--release", "r", "--tiers", "hot"],
                           capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert (f"r: delete from packed, 0 shards, 0 bytes, {len(tokens.files)} token files, {token_bytes} bytes "
            "(token-only replica: --tiers leaves this tier out)") in " ".join(shown.stdout.split())
    runs = [_tier_apply(tmp_path, storage_yaml, "hot") for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert [[(m["action"], m["tier"], m["token_files"], m["token_only"]) for m in json.loads(run.stdout)["moves"]]
            for run in runs] == [[("copy", "hot", len(tokens.files), False),
                                  ("delete", "packed", len(tokens.files), True)], []]
    assert [json.loads(run.stdout)["kept_token_only"] for run in runs] == [[], []]
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["hot"] and all(set(r.replicas) == {"hot"} for r in moved.files)
    assert read_tier_token_manifest(storage.tier("hot"), "r", tokens.tokenizer.sha256) == moved
    assert named_replicas_intact(lake, storage) and read_lake_manifest(lake, "r").tiers == ["hot"]
    assert not (tmp_path / "packed" / "r").exists()
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed", "hot"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot"]}, drop_token_only=True).moves == ()


@pytest.mark.parametrize("kill_at", ["tier:delete:after_token_tier_manifest", "tier:delete:after_token_manifests",
                                     "tier:delete:before_files"])
def test_a_killed_removal_of_a_token_only_replica_is_finished_by_the_next_apply(tmp_path, kill_at) -> None:
    """SIGKILL while `tier apply --tiers hot` removes the token-only replica on 'packed': before the lake's token
    manifest drops 'packed' it is still that replica (the next --tiers apply removes it), after it files no manifest
    names (a leftover, which any next apply finishes, by policy too). The loader reads every token all along."""
    storage, storage_yaml = _storage(tmp_path, "hot", "packed")
    lake, tokens = split_export(tmp_path, storage, text="hot", tokens="packed")
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"])
    killed = _tier_apply(tmp_path, storage_yaml, "hot", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert named_replicas_intact(lake, storage) and read_lake_manifest(lake, "r").tiers == ["hot"]
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed", "hot"]) == expected
    dropped = kill_at != "tier:delete:after_token_tier_manifest"
    assert read_lake_token_manifest(lake, "r").tiers == (["hot"] if dropped else ["hot", "packed"])
    plan = plan_tiers(lake, storage=storage, targets={"r": ["hot"]}, drop_token_only=True)
    assert [(m.action, m.tier, m.leftover, m.token_only) for m in plan.moves] == [
        ("delete", "packed", dropped, not dropped)]
    resumed = _tier_apply(tmp_path, storage_yaml, "hot")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_lake_token_manifest(lake, "r").tiers == ["hot"] and not (tmp_path / "packed" / "r").exists()
    assert named_replicas_intact(lake, storage)
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed", "hot"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["hot"]}, drop_token_only=True).moves == ()


def test_a_token_only_replica_keeps_its_token_files_when_a_leftover_beside_them_goes(tmp_path) -> None:
    """A stale text shard beside the token-only replica (an interrupted apply or export): the leftover delete takes
    the shard, not the token folder the token manifest names there; moving the text off another tier still takes
    that tier's token files."""
    storage, _ = _storage(tmp_path, "hot", "cold", "packed")
    lake, tokens = split_export(tmp_path, storage, text="hot", tokens="packed")
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"])
    packed = storage.tier("packed")
    packed.publish(packed.uri("r", "r-000000.tar"), b"an old replica")
    plan = plan_tiers(lake, storage=storage, targets={"r": ["hot"]})
    assert [(m.action, m.tier, m.leftover, m.token_files) for m in plan.moves] == [
        ("copy", "hot", False, len(tokens.files)), ("delete", "packed", True, 0)]
    assert len(apply_tiers(lake, plan, storage=storage)) == 2
    assert packed.children(packed.uri("r")) == [token_dir(tokens.tokenizer.sha256)]
    assert read_lake_token_manifest(lake, "r").tiers == ["hot", "packed"] and named_replicas_intact(lake, storage)
    # the text moves hot -> cold: hot's token files go with it, packed's stay
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["cold"]}), storage=storage)
    assert read_lake_manifest(lake, "r").tiers == ["cold"] and not (tmp_path / "hot" / "r").exists()
    assert read_lake_token_manifest(lake, "r").tiers == ["cold", "packed"] and named_replicas_intact(lake, storage)
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["packed"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["cold"]}).moves == ()


@pytest.mark.parametrize("kill_at", ["tier:delete:after_token_tier_manifest", "tier:delete:after_token_manifests",
                                     "tier:delete:after_text_manifest", "tier:delete:before_files"])
def test_a_killed_removal_resumes_and_the_loader_never_picks_a_removed_replica(tmp_path, kill_at) -> None:
    """The delete drops the tier from the token manifests (each tier's copy, then the lake's), then from the text
    manifest, then deletes the bytes: a kill before the text manifest leaves a tier the text manifest still names (a
    delete move), a kill after it leaves files no manifest names (a leftover); neither looks like a token-only
    replica, which apply keeps."""
    storage, storage_yaml = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    expected = packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot"])
    assert _tier_apply(tmp_path, storage_yaml, "hot,cold").returncode == 0
    killed = _tier_apply(tmp_path, storage_yaml, "cold", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert named_replicas_intact(lake, storage)
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot", "cold"]) == expected
    text_dropped = kill_at in ("tier:delete:after_text_manifest", "tier:delete:before_files")
    assert read_lake_manifest(lake, "r").tiers == (["cold"] if text_dropped else ["cold", "hot"])
    if kill_at != "tier:delete:after_token_tier_manifest":
        assert read_lake_token_manifest(lake, "r").tiers == ["cold"]
    plan = plan_tiers(lake, storage=storage, targets={"r": ["cold"]})
    assert [(m.action, m.tier, m.leftover) for m in plan.moves] == [("delete", "hot", text_dropped)]
    resumed = _tier_apply(tmp_path, storage_yaml, "cold")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    moved = read_lake_token_manifest(lake, "r")
    assert moved is not None and moved.tiers == ["cold"] and not (tmp_path / "hot" / "r").exists()
    assert packed_tokens(lake_tokens_path(tmp_path, tokens), ["hot", "cold"]) == expected
    assert plan_tiers(lake, storage=storage, targets={"r": ["cold"]}).moves == ()


def test_a_move_hashes_each_copied_token_part_once_at_the_destination(tmp_path, monkeypatch) -> None:
    """The copy reads each part back at the destination and checks its sha256; the delete of the source in the same
    apply trusts that check (the size is still compared) instead of reading every token byte there again: over a
    cross-region link, one full read fewer. A replica that was already there is still hashed before the delete."""
    from datahub.storage.tier import Tier

    storage, _ = _storage(tmp_path, "hot", "cold")
    lake, tokens = _exported(tmp_path, storage)
    hashed: Counter[str] = Counter()
    real_sha256 = Tier.sha256

    def counting_sha256(self, uri, *, cap=None):
        hashed[uri] += 1
        return real_sha256(self, uri, cap=cap)

    monkeypatch.setattr(Tier, "sha256", counting_sha256)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["cold"]}), storage=storage)
    moved = read_lake_token_manifest(lake, "r")
    parts = [f"{record.replicas['cold']}.{part}" for record in moved.files for part in PARTS]
    assert [hashed[uri] for uri in parts] == [1] * len(parts)
    # copied in an earlier apply: the delete hashes the kept replica itself
    hashed.clear()
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["cold", "hot"]}), storage=storage)
    hashed.clear()
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["cold"]}), storage=storage)
    assert [hashed[uri] for uri in parts] == [1] * len(parts)
    assert read_lake_token_manifest(lake, "r").tiers == ["cold"]

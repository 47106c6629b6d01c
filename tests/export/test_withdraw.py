"""`datahub tier remove`: a take-down (DMCA, PII) marks the export withdrawn first, then deletes its shards and token
files on every tier; the loader refuses it with the reason, tier plan/apply never place it again, a re-run finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from datahub.errors import ReleaseError, SpecError
from datahub.export import export_table_version
from datahub.export.tiering import apply_tiers, plan_tiers, remove_release
from datahub.export.tokens import export_table_tokens
from datahub.lake import Lake
from datahub.loader import PackedDataset
from datahub.loader.errors import ManifestError
from datahub.loader.manifest import load_manifest
from datahub.storage import StorageConfig, Tier, validate_storage_config
from tests.export.test_tokens import make_lake, train_tokenizer

REASON = "DMCA notice 2026-12-07 #41"


def _storage(tmp_path: Path) -> StorageConfig:
    return validate_storage_config({"tiers": {name: {"kind": "cfs", "path": str(tmp_path / name)}
                                              for name in ("hot", "cold")}}, source="storage.yaml")


def _on_two_tiers(tmp_path: Path, storage: StorageConfig, *, check_local: bool = True) -> tuple[Lake, int]:
    """Release r: text shards and token files exported to hot, then placed on hot and cold by tier apply."""
    lake, version = make_lake(tmp_path / "lake", 90)
    export_table_version(lake, table="samples", version=version, release_name="r", tier="hot", storage=storage,
                         shard_samples=30)
    export_table_tokens(lake, table="samples", version=version, release_name="r", storage=storage,
                        tokenizer=train_tokenizer(tmp_path / "tok.json"), tier="hot", file_tokens=300)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]}), storage=storage)
    for tier in ("hot", "cold") if check_local else ("hot",):
        assert any(p.suffix == ".tar" for p in (tmp_path / tier / "r").iterdir())
        assert any(p.name.startswith("tokens-") for p in (tmp_path / tier / "r").iterdir())
    return lake, version


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_remove_deletes_every_file_on_both_tiers_and_the_loader_refuses_with_the_reason(tmp_path) -> None:
    storage = _storage(tmp_path)
    lake, version = _on_two_tiers(tmp_path, storage)
    sizes = {tier: sum(p.stat().st_size for p in (tmp_path / tier / "r").rglob("*")
                       if p.is_file() and p.name != "manifest.json") for tier in ("hot", "cold")}

    done = remove_release(lake, "r", reason=REASON, storage=storage)

    for tier in ("hot", "cold"):  # only the marked manifest stays: a trainer pointed at the tier is told why
        assert _files(tmp_path / tier / "r") == ["manifest.json"]
        assert done.removed[tier]["bytes"] == sizes[tier] and done.removed[tier]["files"] >= 6
    assert done.reason == REASON and done.withdrawn_at
    for ref in ("r", str(tmp_path / "hot" / "r" / "manifest.json"), str(tmp_path / "cold" / "r")):
        with pytest.raises(ManifestError, match=r"release 'r' was withdrawn at .*DMCA notice 2026-12-07 #41"):
            load_manifest(ref, lake=str(tmp_path / "lake"))

    token_manifests = sorted((tmp_path / "lake" / "_exports" / "r").glob("tokens-*.json"))
    assert token_manifests and all(REASON in p.read_text() for p in token_manifests)  # marked for PackedDataset too
    for token_manifest in token_manifests:  # PackedDataset names the reason, not a missing token file
        with pytest.raises(ManifestError, match=r"release 'r' was withdrawn at .*DMCA notice 2026-12-07 #41"):
            PackedDataset(str(token_manifest), seq_len=16)

    again = remove_release(lake, "r", reason="another reason", storage=storage)  # nothing left: a no-op
    assert again.removed == {} and again.reason == REASON and again.withdrawn_at == done.withdrawn_at

    assert [m for m in plan_tiers(lake, storage=storage).moves if m.release == "r"] == []  # the policy skips it
    with pytest.raises(SpecError, match="withdrawn"):
        plan_tiers(lake, storage=storage, targets={"r": ["hot", "cold"]})
    with pytest.raises(ReleaseError, match="withdrawn"):  # exporting it again would publish an unmarked manifest
        export_table_version(lake, table="samples", version=version, release_name="r", tier="cold", storage=storage,
                             shard_samples=30)
    for tier in ("hot", "cold"):
        assert _files(tmp_path / tier / "r") == ["manifest.json"]


def test_a_remove_killed_after_the_mark_is_refused_by_the_loader_and_finished_by_a_rerun(tmp_path, monkeypatch) -> None:
    storage = _storage(tmp_path)
    lake, _ = _on_two_tiers(tmp_path, storage)
    real = Tier.delete
    calls: list[str] = []

    def dies(self: Tier, uri: str, *, recursive: bool = False) -> None:
        calls.append(uri)
        if len(calls) == 3:
            raise ConnectionError("the process was killed")
        real(self, uri, recursive=recursive)

    monkeypatch.setattr(Tier, "delete", dies)
    with pytest.raises(ConnectionError):
        remove_release(lake, "r", reason=REASON, storage=storage)
    monkeypatch.setattr(Tier, "delete", real)
    assert len(_files(tmp_path / "hot" / "r")) + len(_files(tmp_path / "cold" / "r")) > 2  # some files are left
    with pytest.raises(ManifestError, match="withdrawn"):
        load_manifest("r", lake=str(tmp_path / "lake"))

    done = remove_release(lake, "r", reason=REASON, storage=storage)
    assert done.files > 0
    for tier in ("hot", "cold"):
        assert _files(tmp_path / tier / "r") == ["manifest.json"]
    assert remove_release(lake, "r", reason=REASON, storage=storage).removed == {}


def test_remove_after_redact_takes_the_old_release_down_and_leaves_the_new_one(tmp_path) -> None:
    from datahub.export import export_release
    from datahub.release import create_release, redact

    storage = _storage(tmp_path)
    lake, _ = make_lake(tmp_path / "lake", 60)
    create_release(lake, "old")
    export_release(lake, "old", tier="hot", storage=storage, shard_samples=20)
    apply_tiers(lake, plan_tiers(lake, storage=storage, targets={"old": ["hot", "cold"]}), storage=storage)
    ids = lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist()
    redact(lake, "new", source="old", sample_ids=[ids[0]], reason="PII: phone number")
    export_release(lake, "new", tier="hot", storage=storage, shard_samples=20)
    new_files = _files(tmp_path / "hot" / "new")

    done = remove_release(lake, "old", reason="PII: phone number", storage=storage)

    assert set(done.removed) == {"hot", "cold"}
    for tier in ("hot", "cold"):
        assert _files(tmp_path / tier / "old") == ["manifest.json"]
    with pytest.raises(ManifestError, match="PII: phone number"):
        load_manifest("old", lake=str(tmp_path / "lake"))
    assert _files(tmp_path / "hot" / "new") == new_files  # the redacted release stays readable
    assert load_manifest("new", lake=str(tmp_path / "lake")).num_samples == 59

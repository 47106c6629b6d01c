"""Storage YAML validation (errors name file and field), credentials handling and the placement policy."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from datahub.errors import SpecError
from datahub.storage import ReleaseState, desired_tiers, load_storage_config, storage_class, validate_storage_config


def test_errors_name_the_file_and_field(tmp_path) -> None:
    path = tmp_path / "storage.yaml"
    path.write_text("tiers:\n  ceph:\n    kind: ceph\n    endpoint_url: rgw:7480\n")
    with pytest.raises(SpecError) as info:
        load_storage_config(path)
    message = str(info.value)
    assert f"{path}: tiers.ceph.endpoint_url: must start with http://" in message  # the YAML's path, not pydantic's
    assert f"{path}: tiers.ceph.bucket: required field is missing" in message  # (tiers.ceph.ceph.bucket: the kind tag)
    path.write_text("tiers:\n  hot:\n    kind: cfs\n    pth: /mnt/cfs\n  x:\n    path: /x\n  z:\n    kind: nfs\n")
    with pytest.raises(SpecError) as info:
        load_storage_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: tiers.hot.path: required field is missing; add it",
        f"{path}: tiers.hot.pth: unknown field; remove it or check the spelling",
        f"{path}: tiers.x.kind: required field is missing; add it: one of ceph, cfs, hdfs",
        f"{path}: tiers.z.kind: 'nfs' is not a tier kind; use one of ceph, cfs, hdfs"]
    with pytest.raises(SpecError, match=r"^s\.yaml: .*policy\.classes\.hot names unknown tiers \[.ceph.\]"):
        validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": "/x"}},
                                 "policy": {"classes": {"hot": ["ceph"]}}}, source="s.yaml")
    with pytest.raises(SpecError, match="storage config not found"):
        load_storage_config(tmp_path / "missing.yaml")


def test_a_job_spec_or_lake_yaml_given_as_storage_says_which_option_takes_it(tmp_path) -> None:
    """`--storage jobs/demo.yaml` printed one 'unknown field' line per job spec section and 'tiers: required'."""
    job = tmp_path / "demo.yaml"
    job.write_text("name: demo\nlake: {root: /tmp/lake}\ninputs: [{uri: /tmp/a.jsonl}]\ngraph: {}\n")
    with pytest.raises(SpecError) as info:
        load_storage_config(job)
    assert str(info.value) == (f"{job}: a job spec (lake:, graph:; --lake takes its lake: section), not a storage "
                               "config; give it as --lake, and the tiers as --storage STORAGE.yaml (tiers:, see "
                               "schemas/storage.example.yaml)")
    lake = tmp_path / "lake.yaml"
    lake.write_text("root: s3://bucket/lake\nstorage_options: {AWS_REGION: us-east-1}\n")
    with pytest.raises(SpecError, match=r"lake\.yaml: a lake YAML \(root:\), not a storage config; give it as --lake"):
        load_storage_config(lake)


def test_ceph_credentials_come_from_env_or_file_and_stay_out_of_repr(tmp_path, monkeypatch) -> None:
    config = validate_storage_config({"tiers": {"ceph": {"kind": "ceph", "endpoint_url": "http://127.0.0.1:1",
                                                         "bucket": "b", "credentials": {"key_env": "K", "secret_env": "S"}}}})
    monkeypatch.delenv("K", raising=False)
    with pytest.raises(SpecError, match="set the environment variables K and S"):
        config.tier("ceph").reader_options()
    monkeypatch.setenv("K", "the-key")
    monkeypatch.setenv("S", "the-secret")
    tier = config.tier("ceph")
    assert tier.reader_options()["secret"] == "the-secret"
    assert "the-secret" not in repr(tier) and tier.uri("r", "x.tar") == "s3://b/r/x.tar"
    creds = tmp_path / "creds"
    creds.write_text("# ceph\naccess_key_id = fk\nsecret_access_key = fs\n")
    from_file = validate_storage_config({"tiers": {"ceph": {"kind": "ceph", "endpoint_url": "http://h:1", "bucket": "b",
                                                            "prefix": "p/q", "credentials": {"file": str(creds)}}}})
    assert (from_file.tier("ceph").reader_options()["key"], from_file.tier("ceph").uri("r")) == ("fk", "s3://b/p/q/r")


def test_second_region_merges_by_tier_name_and_refuses_clashes() -> None:
    a = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": "/a"}}}, source="a.yaml")
    b = validate_storage_config({"tiers": {"cfs-eu": {"kind": "cfs", "path": "/b"}}}, source="b.yaml")
    assert sorted(a.merged(b).tiers) == ["cfs", "cfs-eu"]
    with pytest.raises(SpecError, match="b.yaml: tiers \\['cfs'\\] are also defined in a.yaml"):
        a.merged(validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": "/c"}}}, source="b.yaml"))


def test_policy_classes() -> None:
    policy = validate_storage_config({
        "tiers": {"cfs": {"kind": "cfs", "path": "/a"}, "hdfs": {"kind": "hdfs", "url": "webhdfs://nn:9870/r"}},
        "policy": {"classes": {"hot": ["cfs", "hdfs"], "cold": ["hdfs"]}, "hot_if_read_within_days": 7,
                   "cold_if_unread_days": 90}}).policy
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert storage_class(ReleaseState("r", channels=("stable",)), policy, now=now) == "hot"
    assert storage_class(ReleaseState("r", last_read=now - timedelta(days=3)), policy, now=now) == "hot"
    assert storage_class(ReleaseState("r", last_read=now - timedelta(days=30)), policy, now=now) == "warm"
    assert storage_class(ReleaseState("r", last_read=now - timedelta(days=91)), policy, now=now) == "cold"
    assert storage_class(ReleaseState("r", channels=("stable",), archived=True), policy, now=now) == "cold"
    assert desired_tiers(ReleaseState("r", channels=("stable",)), policy, now=now) == ["cfs", "hdfs"]
    assert desired_tiers(ReleaseState("r", last_read=now - timedelta(days=30)), policy, now=now) is None  # no warm class


def test_unread_counts_from_the_release_date_when_never_read() -> None:
    policy = validate_storage_config({"tiers": {"cfs": {"kind": "cfs", "path": "/x"}},
                                      "policy": {"cold_if_unread_days": 90}}).policy
    now = datetime(2024, 6, 1, tzinfo=timezone.utc)
    assert storage_class(ReleaseState("r", created=now - timedelta(days=10)), policy, now=now) == "warm"
    assert storage_class(ReleaseState("r", created=now - timedelta(days=91)), policy, now=now) == "cold"
    # a read resets the clock; with neither date known the release counts as unread for ever
    assert storage_class(ReleaseState("r", created=now - timedelta(days=400), last_read=now - timedelta(days=20)),
                         policy, now=now) == "warm"
    assert storage_class(ReleaseState("r"), policy, now=now) == "cold"

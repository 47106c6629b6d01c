"""A ceph or hdfs tier whose endpoint does not answer, reached from Python (not through the CLI, which checks the
port first): every tier operation, an export and a tier copy raise datahub's ``StorageError`` naming the tier, the
endpoint and the fix, not botocore's ``EndpointConnectionError`` (nor aiohttp's or requests' errors); it stays a
``TransientError``, so a caller that retries by class still retries it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from datahub.errors import StorageError, TransientError
from datahub.export import export_table_version
from datahub.retry import retry
from datahub.storage import validate_storage_config
from tests.ceph import ceph_s3  # noqa: F401
from tests.export.helpers import make_lake


def _closed_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there, a connect is refused at once
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def storage(tmp_path: Path):
    credentials = tmp_path / "ceph.credentials"
    credentials.write_text("access_key_id=AKIAEXAMPLE\nsecret_access_key=secret\n")
    port = _closed_port()
    return validate_storage_config({"tiers": {
        "archive": {"kind": "ceph", "endpoint_url": f"http://127.0.0.1:{port}", "bucket": "releases",
                    "credentials": {"file": str(credentials)}},
        "cold": {"kind": "hdfs", "url": f"webhdfs://127.0.0.1:{port}/datahub", "connect_timeout_s": 2},
        "local": {"kind": "cfs", "path": str(tmp_path / "cfs")},
    }}, source="storage.yaml"), port


def _says_which_tier_and_how_to_fix(error: StorageError, tier: str, field: str, port: int) -> None:
    text = str(error)
    assert text.startswith(f"tier {tier}: cannot "), text
    assert f"127.0.0.1:{port}" in text and " did not answer (" in text and f"fix tiers.{tier}.{field} in storage.yaml" in text, text
    assert isinstance(error, TransientError)


def test_every_operation_on_an_unreachable_ceph_tier_raises_storage_error(storage) -> None:
    config, port = storage
    tier = config.tier("archive")
    uri = tier.uri("r1", "shard-000000.tar")
    for call in (lambda: tier.size(uri), lambda: list(tier.chunks(uri)),
                 lambda: tier.publish_stream(uri, iter([b"bytes"]), size=None, sha256=None)):
        with pytest.raises(StorageError) as caught:
            call()
        _says_which_tier_and_how_to_fix(caught.value, "archive", "endpoint_url", port)
        assert "RGW (radosgw)" in str(caught.value)


def test_an_unreachable_hdfs_tier_names_the_namenode_and_is_retried_by_class(storage) -> None:
    config, port = storage
    tier = config.tier("cold")
    tries: list[int] = []

    def read() -> bytes:
        tries.append(1)
        return tier.read(tier.uri("r1", "manifest.json"))

    with pytest.raises(StorageError) as caught:
        retry(read, attempts=3, sleep=lambda _: None)
    assert len(tries) == 3  # transient: retried, as a caller retrying TransientError did before
    _says_which_tier_and_how_to_fix(caught.value, "cold", "url", port)
    assert "NameNode (WebHDFS)" in str(caught.value)


def test_export_from_python_to_an_unreachable_tier_raises_storage_error(storage, tmp_path: Path) -> None:
    config, port = storage
    lake, version = make_lake(tmp_path / "lake", n=10)
    with pytest.raises(StorageError) as caught:
        export_table_version(lake, table="samples", version=version, release_name="r1", tier="archive", storage=config)
    _says_which_tier_and_how_to_fix(caught.value, "archive", "endpoint_url", port)


@pytest.mark.ceph
def test_a_missing_key_or_a_refused_signature_is_not_taken_for_an_unreachable_endpoint(
        ceph_s3, tmp_path) -> None:  # noqa: F811
    """On the real RGW, which answers: a missing key stays FileNotFoundError and a wrong secret's refusal names
    what RGW said, neither becomes '... did not answer' (only a failure to answer is classified so). A cfs tier, as
    before, never reaches that classification, so it could not tell."""
    bucket = ceph_s3.new_bucket("tier-answers")

    def ceph_tier(secret: str):
        credentials = tmp_path / f"ceph-{len(secret)}.credentials"
        credentials.write_text(f"access_key_id={ceph_s3.key}\nsecret_access_key={secret}\n")
        return validate_storage_config({"tiers": {"archive": {
            "kind": "ceph", "endpoint_url": ceph_s3.endpoint_url, "bucket": bucket, "prefix": "releases",
            "s3_region": ceph_s3.region, "credentials": {"file": str(credentials)}}}},
            source="storage.yaml").tier("archive")

    tier = ceph_tier(ceph_s3.secret)
    tier.publish(tier.uri("r1", "manifest.json"), b"{}")
    with pytest.raises(FileNotFoundError):
        tier.read(tier.uri("r1", "missing.json"))
    wrong = ceph_tier(ceph_s3.secret + "-wrong")
    for operation in (lambda: wrong.read(wrong.uri("r1", "manifest.json")),
                      lambda: wrong.publish(wrong.uri("r1", "other.json"), b"{}")):
        with pytest.raises(Exception) as caught:
            operation()
        assert " did not answer" not in str(caught.value), caught.value
        assert any(said in str(caught.value) for said in ("Forbidden", "SignatureDoesNotMatch", "AccessDenied")), \
            caught.value  # what RGW answered


def test_a_tier_copy_from_python_to_an_unreachable_tier_raises_storage_error(storage, tmp_path: Path) -> None:
    from datahub.export.tiering import apply_tiers, plan_tiers

    full, port = storage
    # the plan looks at every configured tier (leftovers): an unreachable hdfs tier there fails it, also as StorageError
    config = validate_storage_config({"tiers": {name: full.tiers[name].model_dump() for name in ("archive", "local")}},
                                     source="storage.yaml")
    lake, version = make_lake(tmp_path / "lake", n=10)
    export_table_version(lake, table="samples", version=version, release_name="r1", tier="local", storage=config)
    plan = plan_tiers(lake, storage=config, targets={"r1": ["local", "archive"]})
    with pytest.raises(StorageError) as caught:
        apply_tiers(lake, plan, storage=config, workers=1)
    _says_which_tier_and_how_to_fix(caught.value, "archive", "endpoint_url", port)

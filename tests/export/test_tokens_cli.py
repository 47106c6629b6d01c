"""`datahub export RELEASE --tokenizer PATH` through the CLI."""

from __future__ import annotations

import hashlib
import json

from typer.testing import CliRunner

from datahub.cli.main import app
from tests.export.test_tokens import make_lake, spec_read, train_tokenizer


def test_export_with_a_tokenizer_prints_the_token_manifest(tmp_path) -> None:
    make_lake(tmp_path / "lake", 30)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    runner = CliRunner()
    base = ["export", "t1", "--lake", str(tmp_path / "lake"), "--tier", "cfs", "--storage", str(storage), "--table", "samples"]
    out = runner.invoke(app, [*base, "--tokenizer", str(path), "--file-tokens", "200", "--json"])
    assert out.exit_code == 0, out.output
    manifest = json.loads(out.stdout)
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["num_documents"] == 30 and manifest["dtype"] == "uint16" and len(manifest["files"]) > 1
    tokens, ids = spec_read(manifest["files"][0]["replicas"]["cfs"])
    assert len(ids) == manifest["files"][0]["documents"] and all(t[-1] == manifest["tokenizer"]["eod_id"] for t in tokens)

    human = runner.invoke(app, [*base, "--tokenizer", str(path), "--file-tokens", "200"])
    assert human.exit_code == 0 and "tokenized t1" in human.output and "documents  30" in human.output

    missing = runner.invoke(app, [*base, "--tokenizer", str(tmp_path / "nope.json")])
    assert missing.exit_code != 0 and "no such file or directory" in str(missing.exception)
    stray = runner.invoke(app, [*base, "--file-tokens", "5"])
    assert stray.exit_code != 0 and "go with --tokenizer" in stray.output
    assert "--tokenizer" in runner.invoke(app, ["export", "--help"]).output


def test_export_a_release_by_name(tmp_path) -> None:
    from datahub.lake import Lake
    from datahub.release.create import create_release

    make_lake(tmp_path / "lake", 12)
    release = create_release(Lake(tmp_path / "lake"), "corpus-1")
    path = train_tokenizer(tmp_path / "tok.json")
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  cfs:\n    kind: cfs\n    path: {tmp_path / 'cfs'}\n")
    out = CliRunner().invoke(app, ["export", "corpus-1", "--lake", str(tmp_path / "lake"), "--tier", "cfs",
                                   "--storage", str(storage), "--tokenizer", str(path), "--shuffle-seed", "9", "--json"])
    assert out.exit_code == 0, out.output
    manifest = json.loads(out.stdout)
    assert (manifest["release_digest"], manifest["table_version"]) == (release.digest, int(release.version))
    assert manifest["num_documents"] == 12 and manifest["shuffle_seed"] == 9 and len(manifest["files"]) == 1

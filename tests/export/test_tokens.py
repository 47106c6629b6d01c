"""Tokenized export: Megatron .bin/.idx read back by a reader written here from the format spec (struct + numpy,
not datahub.shards.indexed), byte-identical on Ray, the tokenizer's hash in the manifest and the lineage."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datahub.errors import IntegrityError, ReleaseError, SpecError
from datahub.export.plan import export_order
from datahub.export.source import TableSource
from datahub.export.tokens import export_table_tokens, load_tokenizer
from datahub.lake import Lake
from datahub.shards.token_manifest import read_lake_token_manifest
from tests.engines.conftest import spark_engine  # noqa: F401  (the session Spark fixture)
from tests.export.helpers import cfs_storage

tokenizers = pytest.importorskip("tokenizers")

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
TEXTS = ["the quick brown fox jumps over the lazy dog", "héllo wörld, 世界! <|endoftext|> inside", "", None,
         "tokens tokens tokens " * 20, "a", "numbers 0123456789 and punctuation ;:!?"]


def train_tokenizer(path: Path, *, vocab_size: int = 300) -> Path:
    """A byte-level BPE trained here on a few sentences (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([t for t in TEXTS if t] * 5 + [f"document {i} word" for i in range(50)], trainer)
    tokenizer.save(str(path))
    return path


def make_lake(root: Path, n: int = 90) -> tuple[Lake, int]:
    ids = [hashlib.sha256(f"doc {i}".encode()).hexdigest()[:32] for i in range(n)]
    texts = [TEXTS[i % len(TEXTS)] if i % 3 else f"document {i} " + "word " * (i % 23) for i in range(n)]
    lake = Lake(root)
    table = pa.table({"sample_id": ids, "text": texts, "source_uri": ["file:///in.jsonl"] * n})
    for part in range(3):  # three data files: three engine tasks
        version = lake.commit("samples", table.slice(part * n // 3, n // 3 if part < 2 else n - 2 * (n // 3)),
                              txn=f"seed/{part}")
    assert version is not None and len(TableSource(lake, "samples", version).files()) == 3
    return lake, version


def spec_read(prefix: str) -> tuple[list[list[int]], list[str]]:
    """Megatron-LM's index layout read with struct + numpy: every sequence's tokens, and the .ids lines."""
    idx = Path(prefix + ".idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<Q", idx[9:17]) == (1,)
    dtype = np.dtype(CODES[idx[17]]).newbyteorder("<")
    sequences, documents = struct.unpack("<QQ", idx[18:34])
    lengths = np.frombuffer(idx, "<i4", sequences, 34)
    pointers = np.frombuffer(idx, "<i8", sequences, 34 + 4 * sequences)
    doc_idx = np.frombuffer(idx, "<i8", documents, 34 + 12 * sequences)
    assert len(idx) == 34 + 12 * sequences + 8 * documents
    assert doc_idx.tolist() == list(range(sequences + 1))  # one sequence per document
    data = Path(prefix + ".bin").read_bytes()
    assert len(data) == int(lengths.sum()) * dtype.itemsize
    tokens = [np.frombuffer(data, dtype, int(n), int(p)).tolist() for n, p in zip(lengths, pointers)]
    return tokens, Path(prefix + ".ids").read_text().splitlines()


def expected(lake: Lake, version: int, path: Path, seed: int | None) -> tuple[list[str], dict[str, list[int]]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    eod = tokenizer.token_to_id("<|endoftext|>")
    table = lake.read("samples")
    docs = {sid: tokenizer.encode(text or "", add_special_tokens=False).ids + [eod]
            for sid, text in zip(table["sample_id"].to_pylist(), table["text"].to_pylist())}
    order = export_order(TableSource(lake, "samples", version), shuffle_seed=seed).to_pylist()
    return order, docs


def read_all(manifest, tier: str) -> tuple[list[str], list[list[int]]]:
    ids: list[str] = []
    tokens: list[list[int]] = []
    for record in manifest.files:
        got, names = spec_read(record.replicas[tier])
        assert len(got) == record.documents and sum(map(len, got)) == record.tokens
        tokens += got
        ids += names
    return ids, tokens


@pytest.mark.parametrize("seed", [None, 5])
def test_token_files_equal_the_tokenizer_output_plus_eod_for_every_document(tmp_path, seed) -> None:
    lake, version = make_lake(tmp_path / "lake")
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("cfs", tmp_path / "cfs"))
    manifest = export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                                   storage=storage, file_tokens=400, shuffle_seed=seed)
    order, docs = expected(lake, version, path, seed)
    ids, tokens = read_all(manifest, "cfs")
    assert ids == order  # the text export's order
    assert tokens == [docs[i] for i in order]
    assert len(manifest.files) > 3 and all(f.tokens <= 400 or f.documents == 1 for f in manifest.files)
    assert [f.first_document for f in manifest.files] == list(np.cumsum([0] + [f.documents for f in manifest.files])[:-1])
    assert manifest.tokenizer.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (manifest.dtype, manifest.tokenizer.eod_token, manifest.num_documents) == ("uint16", "<|endoftext|>", 90)
    for record in manifest.files:
        for suffix in ("bin", "idx", "ids"):
            body = Path(record.replicas["cfs"] + "." + suffix).read_bytes()
            assert (len(body), hashlib.sha256(body).hexdigest()) == (record.part(suffix).size, record.part(suffix).sha256)
    on_tier = json.loads(Path(tmp_path / "cfs/r" / f"tokens-{manifest.tokenizer.sha256[:12]}/tokens-manifest.json").read_text())
    assert on_tier == manifest.to_dict() and read_lake_token_manifest(lake, "r") == manifest
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas/tokens-manifest.v1.json").read_text())
    jsonschema.validate(on_tier, schema)
    assert not (tmp_path / "cfs/r" / f"tokens-{manifest.tokenizer.sha256[:12]}/_partial").exists()

    lineage = [r for r in lake.read("lineage").to_pylist() if r["action"] == "exported"]
    assert len(lineage) == 90 and {r["op"] for r in lineage} == {"export-tokens@1"}
    refs = {r["sample_id"]: json.loads(r["ref"]) for r in lineage}
    third = manifest.files[2]
    sid = ids[third.first_document + 1]
    assert refs[sid] == {"tokens": third.replicas["cfs"], "tier": "cfs", "tokenizer": manifest.tokenizer.sha256,
                         "document": 1}
    # our own reader agrees with the spec reader
    from datahub.shards.indexed import IndexedDataset

    dataset = IndexedDataset(third.replicas["cfs"])
    assert dataset[1].tolist() == docs[sid] and dataset.sample_ids[1].as_py() == sid

    # a second run is a no-op; a damaged file is rewritten with the same bytes
    assert export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                               storage=storage, file_tokens=400, shuffle_seed=seed) == manifest
    damaged = Path(third.replicas["cfs"] + ".bin")
    damaged.write_bytes(damaged.read_bytes()[:-2])
    export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                        storage=storage, file_tokens=400, shuffle_seed=seed)
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() == third.bin.sha256
    with pytest.raises(ReleaseError, match="other settings"):
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                            storage=storage, file_tokens=999, shuffle_seed=seed)


@pytest.mark.parametrize("engine_name", ["ray", "spark"])
def test_engines_write_the_bytes_of_a_local_export(tmp_path, request, engine_name) -> None:
    engine = request.getfixturevalue(f"{engine_name}_engine")
    lake, version = make_lake(tmp_path / "lake", 120)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("local", tmp_path / "local"), (engine_name, tmp_path / engine_name))

    def run(tier: str, **kw):
        return export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier=tier,
                                   storage=storage, file_tokens=700, shuffle_seed=3, **kw)

    local = run("local")
    remote = run(engine_name, engine=engine, workers=2)  # a second tier: the same bytes are required and checked
    assert len(local.files) > 2 and remote.tiers == sorted(["local", engine_name])
    for record in remote.files:
        for suffix in ("bin", "idx", "ids"):
            assert Path(record.replicas[engine_name] + "." + suffix).read_bytes() == \
                Path(record.replicas["local"] + "." + suffix).read_bytes()
    assert [f.bin.sha256 for f in local.files] == [f.bin.sha256 for f in remote.files]
    order, docs = expected(lake, version, path, 3)
    ids, tokens = read_all(remote, engine_name)
    assert ids == order and tokens == [docs[i] for i in order]
    assert not (tmp_path / engine_name / "r" / local.files[0].replicas["local"].split("/")[-2] / "_partial").exists()


def test_tokenizer_paths_and_errors(tmp_path) -> None:
    path = train_tokenizer(tmp_path / "tok.json")
    with pytest.raises(SpecError, match="no such file"):
        load_tokenizer(tmp_path / "missing.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "vocab.txt").write_text("a\n")
    with pytest.raises(SpecError, match="no tokenizer.json.*vocab.txt"):
        load_tokenizer(empty)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="not a tokenizers JSON"):
        load_tokenizer(bad)
    with pytest.raises(SpecError, match="--eod-token"):
        load_tokenizer(path, eod_token="<nope>")
    # a Hugging Face directory: tokenizer.json, and the EOS named by tokenizer_config.json
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "tokenizer.json").write_bytes(path.read_bytes())
    (hf / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    loaded = load_tokenizer(hf)
    assert (loaded.info.eod_token, loaded.info.sha256) == ("<pad>", hashlib.sha256(path.read_bytes()).hexdigest())
    assert load_tokenizer(path).info.eod_token == "<|endoftext|>"
    flat, lengths = load_tokenizer(path, eod_token="<pad>").encode(pa.array(["a b", None]))
    assert lengths.tolist() == [len(flat) - 1, 1] and flat[-1] == loaded.info.eod_id


def test_large_vocabulary_writes_int32(tmp_path) -> None:
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(70_000)} | {"<|endoftext|>": 70_000, "[UNK]": 70_001}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    from tokenizers import pre_tokenizers

    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "wl.json"))
    loaded = load_tokenizer(tmp_path / "wl.json")
    assert loaded.dtype == np.int32
    flat, lengths = loaded.encode(pa.array(["t69999 t1 zzz"]))
    assert flat.tolist() == [69_999, 1, 70_001, 70_000] and lengths.tolist() == [4]


def test_refuses_a_table_without_text(tmp_path) -> None:
    lake = Lake(tmp_path / "lake")
    version = lake.commit("samples", pa.table({"sample_id": ["a"], "caption": ["x"]}), txn="seed/1")
    path = train_tokenizer(tmp_path / "tok.json")
    with pytest.raises(IntegrityError, match="'text'"):
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                            storage=cfs_storage(("cfs", tmp_path / "cfs")))


def test_killed_export_resumes_keeping_the_journalled_files(tmp_path) -> None:
    """SIGKILL after the second published file; the re-run keeps files 0-1 (not rewritten) and writes the rest:
    the same bytes as an export that was never killed."""
    import os
    import signal
    import subprocess
    import sys

    from datahub.pipeline.faults import KILL_AT_ENV

    make_lake(tmp_path / "lake", 90)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = tmp_path / "storage.yaml"
    storage.write_text(f"tiers:\n  a:\n    kind: cfs\n    path: {tmp_path / 'a'}\n  b:\n    kind: cfs\n    path: {tmp_path / 'b'}\n")

    def cli(tier: str, release: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
        if kill_at:
            env[KILL_AT_ENV] = kill_at
        return subprocess.run([sys.executable, "-m", "datahub.cli.main", "export", release, "--lake", str(tmp_path / "lake"),
                               "--tier", tier, "--storage", str(storage), "--table", "samples", "--tokenizer", str(path),
                               "--file-tokens", "300", "--json"], env=env, capture_output=True, text=True, timeout=300)

    killed = cli("a", "r", "export-tokens:after_file:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folder = tmp_path / "a/r" / f"tokens-{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    kept = {p.name: p.stat().st_mtime_ns for p in folder.glob("r-00000[01].*")}
    assert len(kept) == 6 and not (folder / "tokens-manifest.json").exists()
    assert read_lake_token_manifest(Lake(tmp_path / "lake"), "r") is None
    resumed = cli("a", "r")
    assert resumed.returncode == 0, resumed.stderr
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("r-00000[01].*")} == kept
    assert not (folder / "_partial").exists()
    manifest = json.loads(resumed.stdout)
    clean = cli("b", "r2")
    assert clean.returncode == 0, clean.stderr
    for record in manifest["files"]:
        for suffix in ("bin", "idx", "ids"):
            assert Path(record["replicas"]["a"] + "." + suffix).read_bytes() == \
                Path(record["replicas"]["a"].replace(str(tmp_path / "a/r"), str(tmp_path / "b/r2")).replace("/r-", "/r2-")
                     + "." + suffix).read_bytes()


def test_truncation_and_padding_in_the_tokenizer_file_are_ignored(tmp_path) -> None:
    from tokenizers import Tokenizer

    path = train_tokenizer(tmp_path / "tok.json")
    tokenizer = Tokenizer.from_file(str(path))
    whole = tokenizer.encode(TEXTS[4], add_special_tokens=False).ids
    tokenizer.enable_truncation(max_length=4)
    tokenizer.enable_padding(length=8, pad_id=1, pad_token="<pad>")
    tokenizer.save(str(tmp_path / "truncating.json"))
    from datahub.export import tokens

    tokens._LOADED.clear()  # a fresh process: the file's settings are what a task would load
    flat, lengths = load_tokenizer(tmp_path / "truncating.json").encode(pa.array([TEXTS[4], "a"]))
    assert len(whole) > 8 and flat[: len(whole)].tolist() == whole and lengths[0] == len(whole) + 1
    assert lengths[1] == 2


def test_missing_tokenizers_package_says_what_to_install(tmp_path, monkeypatch) -> None:
    import sys

    from datahub.errors import MissingDependencyError

    path = train_tokenizer(tmp_path / "tok.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'datahub\[tokens\]'"):
        load_tokenizer(path)


def test_token_export_takes_no_journal_of_another_lake_and_refuses_other_settings_after_lineage(tmp_path,
                                                                                               monkeypatch) -> None:
    """Two lakes share a tier: lake 1's token export of r is killed after file 0; lake 2's export of r (same table,
    version, settings) wrote lake 1's tokens as its own. And a first try killed after its lineage commit, re-run
    with other --file-tokens, is refused (its lineage names the first try's files)."""
    import datahub.export.tokens as tokens_module

    first, version = make_lake(tmp_path / "lake1", 90)
    second = Lake(tmp_path / "lake2")
    table = first.read("samples")
    ids = [f"{i[:-1]}x" for i in table.column("sample_id").to_pylist()]  # other samples, the same texts (plan)
    other = table.set_column(table.schema.get_field_index("sample_id"), "sample_id", pa.array(ids))
    for part in range(3):
        second.commit("samples", other.slice(part * 30, 30), txn=f"seed/{part}")
    assert int(second.table("samples").version()) == version
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("shared", tmp_path / "shared"), ("clean", tmp_path / "clean"))
    original = tokens_module.checkpoint
    kill_at = ["export-tokens:after_file:0"]

    def killed(name: str) -> None:
        if name == kill_at[0]:
            raise KeyboardInterrupt(name)
        original(name)

    def export(lake, tier, release="r", file_tokens=300):
        return export_table_tokens(lake, table="samples", version=version, release_name=release, tokenizer=path,
                                   tier=tier, storage=storage, file_tokens=file_tokens)

    monkeypatch.setattr(tokens_module, "checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        export(first, "shared")
    monkeypatch.setattr(tokens_module, "checkpoint", original)
    shared = export(second, "shared")
    clean = export(second, "clean", release="r")
    for mine, reference in zip(shared.files, clean.files):
        for suffix in ("bin", "idx", "ids"):
            assert Path(mine.replicas["shared"] + "." + suffix).read_bytes() == \
                Path(reference.replicas["clean"] + "." + suffix).read_bytes()

    kill_at[0] = "export-tokens:before_manifest"
    monkeypatch.setattr(tokens_module, "checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        export(first, "shared", release="r3")
    monkeypatch.setattr(tokens_module, "checkpoint", original)
    with pytest.raises(ReleaseError, match="'r3' was half-exported to tier shared with other settings"):
        export(first, "shared", release="r3", file_tokens=500)
    assert len(export(first, "shared", release="r3").files) >= 1


def test_second_tier_token_export_refuses_to_publish_files_that_vanished(tmp_path, monkeypatch) -> None:
    """Files deleted on the second tier during the export (an apply of an older datahub, by hand): the token export
    published a manifest naming that tier for them (as the text export did before 2e440d0); now it checks each
    file's parts are there at their size before the manifest names the tier, and a re-run publishes."""
    import datahub.export.tokens as tokens_module

    lake, version = make_lake(tmp_path / "lake", 90)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("hot", tmp_path / "hot"), ("cold", tmp_path / "cold"))

    def export(tier: str):
        return export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path,
                                   tier=tier, storage=storage, file_tokens=300)

    hot = export("hot")
    assert len(hot.files) > 2
    original = tokens_module.checkpoint

    def deleted(name: str) -> None:
        if name == "export-tokens:after_file:1":
            for part in (tmp_path / "cold" / "r").rglob("r-*.*"):
                part.unlink()
        original(name)

    monkeypatch.setattr(tokens_module, "checkpoint", deleted)
    with pytest.raises(IntegrityError, match=r"vanished from tier cold during the export .*re-run the export"):
        export("cold")
    assert read_lake_token_manifest(lake, "r", hot.tokenizer.sha256).tiers == ["hot"]
    monkeypatch.setattr(tokens_module, "checkpoint", original)
    cold = export("cold")
    assert cold.tiers == ["cold", "hot"]
    for record in cold.files:
        for suffix in ("bin", "idx", "ids"):
            assert Path(record.replicas["cold"] + "." + suffix).stat().st_size == record.part(suffix).size


def _greedy_files(lengths: np.ndarray, file_tokens: int) -> list[int]:
    """Documents of each file, one document at a time: a file closes before a document that does not fit."""
    files, documents, tokens = [], 0, 0
    for length in lengths.tolist():
        if documents and tokens + length > file_tokens:
            files.append(documents)
            documents = tokens = 0
        documents, tokens = documents + 1, tokens + length
    return files + [documents] if documents else files


def test_file_cuts_fed_in_pieces_cut_the_files_of_the_whole() -> None:
    """The plan cuts files bucket by bucket (``final`` at the last), holding two counts of the open file: the files
    and their tokens are those cut from the whole, whatever the pieces (empty ones included)."""
    from datahub.export.tokens import FileCuts, cut_files

    rng = np.random.default_rng(4)
    for file_tokens in (1, 7, 50, 10_000):
        for piece in (1, 37, 500):
            lengths = rng.integers(1, 40, size=500)
            lengths[rng.integers(0, 500, size=5)] = 3 * file_tokens + 1  # documents larger than a file
            whole = cut_files(lengths, file_tokens=file_tokens)
            assert [s.samples for s in whole] == _greedy_files(lengths, file_tokens)
            rule, cuts = FileCuts(file_tokens), []
            for begin in range(0, 500, piece):
                cuts += rule.feed(lengths[begin:begin + piece], False)
                cuts += rule.feed(lengths[:0], False)
            cuts += rule.feed(lengths[:0], True)
            assert [take for take, _ in cuts] == [s.samples for s in whole] and sum(t for t, _ in cuts) == 500
            assert [tokens for _, tokens in cuts] == [int(lengths[s.start:s.start + s.samples].sum()) for s in whole]
            assert all(tokens <= file_tokens or take == 1 for take, tokens in cuts)
            # a file closes only before a document that does not fit
            assert all(tokens + lengths[s.start + s.samples] > file_tokens for (_, tokens), s in zip(cuts, whole[:-1]))


@pytest.mark.parametrize("seed", [None, 5])
def test_token_export_planned_in_many_buckets_writes_the_files_of_one_bucket(tmp_path, seed) -> None:
    """The driver plans on local disk, key bucket by key bucket: with 4 documents a bucket (files span buckets) the
    files, digest and lineage are those of a one-bucket plan, cut as ``cut_files`` cuts the whole."""
    from datahub.export.tokens import cut_files

    lake, version = make_lake(tmp_path / "lake")
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("one", tmp_path / "one"), ("many", tmp_path / "many"))

    def run(tier: str, **kw):
        return export_table_tokens(lake, table="samples", version=version, release_name=f"r-{tier}", tokenizer=path,
                                   tier=tier, storage=storage, file_tokens=300, shuffle_seed=seed, **kw)

    one, many = run("one"), run("many", bucket_rows=4)
    assert len(one.files) > 3 and [f.documents for f in one.files] == [f.documents for f in many.files]
    assert [(f.bin.sha256, f.idx.sha256, f.ids.sha256) for f in one.files] == \
        [(f.bin.sha256, f.idx.sha256, f.ids.sha256) for f in many.files]
    assert one.release_digest == many.release_digest
    order, docs = expected(lake, version, path, seed)
    assert [s.samples for s in cut_files(np.array([len(docs[i]) for i in order]), file_tokens=300)] == \
        [f.documents for f in many.files]
    lineage = {tier: sorted((r["sample_id"], json.loads(r["ref"])["document"]) for r in lake.read("lineage").to_pylist()
                            if r["action"] == "exported" and r["run_id"].startswith(f"export-tokens/r-{tier}/"))
               for tier in ("one", "many")}
    assert lineage["one"] == lineage["many"] and len(lineage["many"]) == 90


@pytest.mark.parametrize("seed", [None, 5])
def test_token_files_written_in_small_pieces_are_the_bytes_and_sha256s_of_whole_ones(tmp_path, monkeypatch,
                                                                                      seed) -> None:
    """``.bin`` is ordered and written a piece at a time and every part is hashed as it is written: with pieces of
    a few bytes (most documents a piece of their own) and 3 ids a piece, the files are those of the default pieces,
    and the manifest's sizes and sha256s are those of the bytes on the tier."""
    from datahub.export import tokens

    lake, version = make_lake(tmp_path / "lake")
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("whole", tmp_path / "whole"), ("pieces", tmp_path / "pieces"))

    def run(tier: str):
        return export_table_tokens(lake, table="samples", version=version, release_name=f"r-{tier}", tokenizer=path,
                                   tier=tier, storage=storage, file_tokens=300, shuffle_seed=seed)

    whole = run("whole")
    monkeypatch.setattr(tokens, "PIECE_BYTES", 5)
    monkeypatch.setattr(tokens, "IDS_PIECE", 3)
    pieces = run("pieces")
    assert len(whole.files) > 3
    for one, other in zip(whole.files, pieces.files, strict=True):
        for part in ("bin", "idx", "ids"):
            written = (tmp_path / "pieces" / "r-pieces" / f"tokens-{whole.tokenizer.sha256[:12]}" /
                       f"{other.prefix}.{part}").read_bytes()
            assert (one.part(part).size, one.part(part).sha256) == (other.part(part).size, other.part(part).sha256) \
                == (len(written), hashlib.sha256(written).hexdigest())


def test_piece_ends_close_a_piece_at_the_byte_budget_and_give_a_large_document_its_own() -> None:
    from datahub.export.tokens import PIECE_BYTES, _piece_ends

    nbytes = np.array([PIECE_BYTES // 2, PIECE_BYTES // 2, 1, 3 * PIECE_BYTES, 2, 2, PIECE_BYTES - 4, 1],
                      dtype=np.int64)
    assert _piece_ends(nbytes).tolist() == [2, 3, 4, 7, 8]
    assert _piece_ends(np.zeros(0, dtype=np.int64)).tolist() == []


def test_a_sample_id_with_a_newline_publishes_no_part_of_its_file(tmp_path) -> None:
    """``.ids`` is published first and its encoding refuses an id holding a newline: the export fails before any
    part of that file (``.bin``/``.idx`` included) is on the tier."""
    lake = Lake(tmp_path / "lake")
    version = lake.commit("samples", pa.table({"sample_id": ["a", "b\nc", "d"], "text": ["x y", "y z", "z"]}),
                          txn="seed")
    path = train_tokenizer(tmp_path / "tok.json")
    with pytest.raises(IntegrityError, match="newline"):
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                            storage=cfs_storage(("cfs", tmp_path / "cfs")))
    assert not [p for p in (tmp_path / "cfs").rglob("r-*") if p.suffix in (".bin", ".idx", ".ids")]

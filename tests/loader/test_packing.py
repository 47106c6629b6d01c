"""PackedDataset: every token exactly once over ranks x workers, token-exact resume after a kill, elastic 3 -> 2."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from datahub.loader.packing import PackedDataset  # noqa: E402
from tests.loader.tokens import real_tokens, write_tokens  # noqa: E402

SEQ = 16
SETTINGS: dict[str, Any] = {"seq_len": SEQ, "seed": 3, "epoch": 1, "shuffle_buffer": 40, "batch_size": 3}


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[list[str], int]:
    return write_tokens(tmp_path / "tokens")


def read_all(loader: Any) -> tuple[list[int], int]:
    out, batches = [], 0
    for batch in loader:
        out.extend(real_tokens({k: np.asarray(v) for k, v in batch.items()}))
        batches += 1
    return out, batches


def test_every_token_once_over_3_ranks_x_2_workers(corpus: tuple[list[str], int]) -> None:
    prefixes, total = corpus
    seen: Counter[int] = Counter()
    counts = set()
    for rank in range(3):
        dataset = PackedDataset(prefixes, rank=rank, world_size=3, **SETTINGS)
        tokens, batches = read_all(DataLoader(dataset, batch_size=None, num_workers=2))
        seen.update(tokens)
        counts.add(batches)
    assert len(counts) == 1, "every rank yields the same number of batches"
    assert sorted(seen) == list(range(1, total + 1)) and set(seen.values()) == {1}


def test_order_is_deterministic_and_documents_are_marked(corpus: tuple[list[str], int]) -> None:
    prefixes, _ = corpus
    first = [b["tokens"].tolist() for b in PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)]
    again = [b["tokens"].tolist() for b in PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)]
    other = [b["tokens"].tolist() for b in PackedDataset(prefixes, rank=0, world_size=1, **{**SETTINGS, "seed": 4})]
    assert first == again and first != other
    for batch in PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS):
        for tokens, mask, positions, segments in zip(batch["tokens"], batch["loss_mask"], batch["position_ids"],
                                                     batch["segment_ids"]):
            real = int(mask.sum())
            assert mask[:real].all() and not mask[real:].any(), "padding only at the end of the epoch's last sequence"
            # ids are consecutive within a document: a segment is one run of consecutive ids, positions count it
            for segment in np.unique(segments[:real]):
                where = np.flatnonzero(segments[:real] == segment)
                assert (np.diff(tokens[where]) == 1).all()
                assert positions[where].tolist() == list(range(len(where)))


def test_rows_that_start_mid_document_number_its_tail_segment_0_and_the_next_document_1(tmp_path: Path) -> None:
    """Segments and positions against the documents the token ids come from, through DataLoader workers (arrays made
    in the worker) and after a resume mid-document: a row's leading piece of a document is its own segment, so no
    two documents share one (deriving the piece starts from clipped segment ids would merge them)."""
    from datahub.shards.indexed import IndexedDataset

    prefixes, _ = write_tokens(tmp_path / "tokens", files=2, documents=12, max_len=25)
    ends = np.cumsum(np.concatenate([IndexedDataset(p).sequence_lengths for p in prefixes]).astype(np.int64))
    firsts = np.concatenate([[0], ends[:-1]]) + 1  # each document's first token id
    dataset = PackedDataset(prefixes, rank=0, world_size=1, seq_len=11, shuffle_buffer=5, batch_size=4)
    state = dataset.state_dict(consumed=0)
    dataset.load_state_dict({**state, "tokens": 3})
    mid_document_rows = 0
    for batch in DataLoader(dataset, batch_size=None, num_workers=2):
        for tokens, mask, segments, positions in zip(batch["tokens"], batch["loss_mask"], batch["segment_ids"],
                                                     batch["position_ids"]):
            ids = tokens[mask].astype(np.int64)
            documents = np.searchsorted(ends, ids - 1, "right")
            piece_starts = np.flatnonzero(np.concatenate([[True], documents[1:] != documents[:-1]]))
            mid_document_rows += int(ids[0] != firsts[documents[0]] and len(piece_starts) > 1)
            lengths = np.diff(np.append(piece_starts, len(ids)))
            assert segments[mask].tolist() == np.repeat(np.arange(len(piece_starts)), lengths).tolist()
            assert positions[mask].tolist() == (np.arange(len(ids)) - np.repeat(piece_starts, lengths)).tolist()
    assert mid_document_rows > 3


def test_resume_3_ranks_to_2_ranks_token_exact(corpus: tuple[list[str], int]) -> None:
    prefixes, total = corpus
    seen: Counter[int] = Counter()
    states = []
    for rank in range(3):
        dataset = PackedDataset(prefixes, rank=rank, world_size=3, **SETTINGS)
        loader = iter(DataLoader(dataset, batch_size=None, num_workers=2))
        for _ in range(4):
            seen.update(real_tokens({k: np.asarray(v) for k, v in next(loader).items()}))
        states.append(dataset.state_dict(consumed=4))
    assert all(state == states[0] for state in states), "the state is the same dict on every rank"
    assert states[0]["tokens"] == 4 * 3 * 3 * SEQ
    for rank in range(2):  # elastic: 2 ranks, another batch size and one worker
        dataset = PackedDataset(prefixes, rank=rank, world_size=2, **{**SETTINGS, "batch_size": 5})
        dataset.load_state_dict(json.loads(json.dumps(states[0])))
        seen.update(read_all(DataLoader(dataset, batch_size=None, num_workers=1))[0])
    assert sorted(seen) == list(range(1, total + 1)) and set(seen.values()) == {1}


def test_resume_with_another_seq_len_is_token_exact(corpus: tuple[list[str], int]) -> None:
    prefixes, total = corpus
    dataset = PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)
    seen: Counter[int] = Counter()
    for step, batch in enumerate(dataset):
        seen.update(real_tokens(batch))
        if step == 5:
            break
    state = dataset.state_dict()  # num_workers=0: the count is this process's
    resumed = PackedDataset(prefixes, rank=0, world_size=1, **{**SETTINGS, "seq_len": 7})
    resumed.load_state_dict(state)
    seen.update(read_all(resumed)[0])
    assert sorted(seen) == list(range(1, total + 1)) and set(seen.values()) == {1}


def test_state_refuses_another_order(corpus: tuple[list[str], int]) -> None:
    prefixes, _ = corpus
    state = PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS).state_dict()
    with pytest.raises(ValueError, match="seed"):
        PackedDataset(prefixes, rank=0, world_size=1, **{**SETTINGS, "seed": 9}).load_state_dict(state)


def test_state_needs_the_count_with_workers(corpus: tuple[list[str], int]) -> None:
    from datahub.loader.errors import ConsumedCountRequiredError

    prefixes, _ = corpus
    dataset = PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)
    next(iter(DataLoader(dataset, batch_size=None, num_workers=1)))
    with pytest.raises(ConsumedCountRequiredError, match="consumed=N"):
        dataset.state_dict()


TRAINER = """
import json, os, signal, sys
import numpy as np
from torch.utils.data import DataLoader
from datahub.loader.packing import PackedDataset
from tests.loader.tokens import real_tokens
prefixes, out, stop, settings = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
dataset = PackedDataset(prefixes, rank=0, world_size=1, **settings)
if os.path.exists(out + "/ckpt.json"):
    dataset.load_state_dict(json.load(open(out + "/ckpt.json"))["data"])
seen = []
for step, batch in enumerate(DataLoader(dataset, batch_size=None, num_workers=2)):
    seen += real_tokens({k: np.asarray(v) for k, v in batch.items()})
    with open(out + "/ckpt.tmp", "w") as f:  # the trainer checkpoints every step, atomically
        json.dump({"data": dataset.state_dict(consumed=step + 1), "seen": seen}, f)
    os.replace(out + "/ckpt.tmp", out + "/ckpt.json")
    if step + 1 == stop:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_killed_at_40_percent_resumes_token_exact(corpus: tuple[list[str], int], tmp_path: Path) -> None:
    prefixes, total = corpus
    batches = len(PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS))
    stop = int(batches * 0.4)
    run = [sys.executable, "-c", TRAINER, json.dumps(prefixes), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    killed = subprocess.run([*run, str(stop), json.dumps(SETTINGS)], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = json.loads((tmp_path / "ckpt.json").read_text())
    assert before["data"]["tokens"] == stop * SETTINGS["batch_size"] * SEQ
    resumed = subprocess.run([*run, "0", json.dumps(SETTINGS)], env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    after = json.loads((tmp_path / "ckpt.json").read_text())
    seen = Counter(before["seen"] + after["seen"])
    assert sorted(seen) == list(range(1, total + 1)) and set(seen.values()) == {1}


def test_batches_cross_workers_as_arrays_and_wrap_as_tensors(corpus: tuple[list[str], int]) -> None:
    from datahub.loader.packing import TokenBatch

    prefixes, _ = corpus
    batch = next(iter(DataLoader(PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS), batch_size=None,
                                 num_workers=1)))
    assert isinstance(batch, TokenBatch) and isinstance(batch["tokens"], np.ndarray)
    assert batch["tokens"].shape == (SETTINGS["batch_size"], SEQ) and len(batch) == SETTINGS["batch_size"]
    tensors = batch.to_torch()
    assert tensors["tokens"].dtype == torch.int32 and tensors["loss_mask"].dtype == torch.bool
    tensors["tokens"][0, 0] = -5  # a view, not a copy
    assert batch["tokens"][0, 0] == -5


def test_pin_memory_copies_token_batches_into_the_pinned_tensors_to_torch_returns(
        corpus: tuple[list[str], int], monkeypatch: pytest.MonkeyPatch) -> None:
    """DataLoader(pin_memory=True)'s pin thread applies torch's ``pin_memory`` to each batch, which returned a
    TokenBatch unchanged (not a tensor, Mapping nor Sequence, no ``pin_memory()``): the flag did nothing. There is no
    accelerator here, so torch's own pinning is stood in for (``Tensor.pin_memory``: a recorded clone) to check what
    datahub builds from it; a real pinned copy was not run. Without an accelerator the batch passes through."""
    from torch.utils.data._utils.pin_memory import pin_memory

    from datahub.loader.packing import TokenBatch

    prefixes, _ = corpus
    batches = list(itertools.islice(DataLoader(PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS),
                                               batch_size=None, num_workers=1), 2))
    single = next(iter(PackedDataset(prefixes, rank=0, world_size=1, **{**SETTINGS, "batch_size": None})))
    assert not torch.accelerator.is_available() and pin_memory(batches[0]) is batches[0]

    pinned_tensors: list[Any] = []

    def pinned_copy(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        pinned_tensors.append(tensor.clone())
        return pinned_tensors[-1]

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pinned_copy)
    for batch in [*batches, single]:
        pinned = pin_memory(batch)
        assert isinstance(pinned, TokenBatch) and pinned is not batch
        assert pinned.keys() == batch.keys() and len(pinned) == len(batch)
        tensors = pinned.to_torch()
        assert list(tensors) == batch.keys()
        for key, tensor in tensors.items():
            # the pinned tensors themselves (a non_blocking copy records its stream on their host blocks)
            assert any(tensor is made for made in pinned_tensors), key
            assert np.array_equal(pinned[key], batch[key]) and pinned[key].shape == batch[key].shape
            assert np.shares_memory(pinned[key], tensor.numpy()) and not np.shares_memory(pinned[key], batch[key])


def test_batches_kept_by_the_trainer_are_not_overwritten_by_later_ones(tmp_path: Path) -> None:
    """Every batch of ``list(loader)`` (all held at once) still holds what its worker sent: the shared-memory ring
    must not reuse a batch's bytes while any of its arrays is alive (more batches than one ring holds)."""
    prefixes, _ = write_tokens(tmp_path / "tokens", files=6, documents=300, max_len=600)
    settings = {"seq_len": 512, "batch_size": 8, "seed": 1}
    want = [np.array(b["tokens"]) for b in PackedDataset(prefixes, **settings)]
    kept = list(DataLoader(PackedDataset(prefixes, **settings), batch_size=None, num_workers=2))
    assert len(kept) == len(want)
    assert sorted(np.asarray(b["tokens"]).tobytes() for b in kept) == sorted(w.tobytes() for w in want)


def test_reads_a_token_manifest(corpus: tuple[list[str], int], tmp_path: Path) -> None:
    import hashlib

    from datahub.shards.token_manifest import FilePart, TokenFileRecord, TokenizerInfo, TokenManifest

    prefixes, total = corpus

    def part(path: str) -> FilePart:
        data = Path(path).read_bytes()
        return FilePart(len(data), hashlib.sha256(data).hexdigest())

    records, first = [], 0
    for prefix in prefixes:
        documents = len(Path(prefix + ".ids").read_text().splitlines())
        tokens = Path(prefix + ".bin").stat().st_size // 4
        records.append(TokenFileRecord(prefix=Path(prefix).name, documents=documents, tokens=tokens,
                                       first_document=first, bin=part(prefix + ".bin"), idx=part(prefix + ".idx"),
                                       ids=part(prefix + ".ids"),
                                       replicas={"ceph": f"s3://bucket/{Path(prefix).name}", "cfs": prefix}))
        first += documents
    manifest = TokenManifest(release="tok-v1", created="2026-12-04T00:00:00Z", table="samples", table_version=1,
                             release_digest="ab" * 32, shuffle_seed=0, dtype="int32", files=tuple(records),
                             tokenizer=TokenizerInfo(sha256="cd" * 32, vocab_size=10**6, eod_id=0, eod_token="</s>"))
    path = tmp_path / "tokens-manifest.json"
    path.write_bytes(manifest.to_json())
    seen: Counter[int] = Counter()
    for rank in range(2):
        dataset = PackedDataset(str(path), rank=rank, world_size=2, **SETTINGS)  # the cfs replica: ceph is remote
        seen.update(read_all(dataset)[0])
        assert dataset.state_dict()["release"] == "tok-v1"
    assert sorted(seen) == list(range(1, total + 1)) and set(seen.values()) == {1}
    from datahub.errors import SpecError

    with pytest.raises(SpecError, match="no local replica"):
        PackedDataset(manifest, seq_len=8, tier_preference=["ceph"])


def test_layout_blocks_gather_every_files_documents_as_file_by_file(tmp_path: Path) -> None:
    # a block's documents come from several files; they are gathered from all files' documents at once (each
    # DataLoader worker builds every block its batches touch): the same offsets, files and starts as reading
    # each file's documents on its own, and every document of the epoch once
    from datahub.loader.packing import TokenFiles, TokenLayout

    prefixes, _ = write_tokens(tmp_path / "tok", files=7, documents=23, max_len=30)
    for append_eod in (None, 0):
        files = TokenFiles.open(prefixes, append_eod=append_eod)
        layout = TokenLayout(files, seed=5, epoch=2, shuffle=True, shuffle_buffer=50)
        blocks = len(layout.block_starts) - 1
        assert blocks > 1 and len(set(files.documents)) == 1
        seen, several = [], 0
        for block in range(blocks):
            cumulative, file_of, starts = layout._block(block)
            lo, hi = int(layout.order.boundaries[block]), int(layout.order.boundaries[block + 1])
            want_file, want_doc = layout.order.lookup(np.arange(lo, hi, dtype=np.int64))
            several += len(set(want_file.tolist())) > 1
            lengths = [int(files.files[f].sequence_lengths[d]) + (append_eod is not None)
                       for f, d in zip(want_file.tolist(), want_doc.tolist())]
            first = [int(files.files[f].sequence_pointers[d]) // files.files[f].dtype.itemsize
                     for f, d in zip(want_file.tolist(), want_doc.tolist())]
            assert file_of.tolist() == want_file.tolist() and starts.tolist() == first
            assert cumulative.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
            assert int(layout.block_starts[block + 1] - layout.block_starts[block]) == cumulative[-1]
            seen.extend(zip(want_file.tolist(), want_doc.tolist()))
        assert several >= 2, "blocks of several files (whole files of >= 50 documents: 3 of 23)"
        assert sorted(seen) == [(f, d) for f in range(7) for d in range(23)]


def test_layout_pieces_cover_any_token_range_across_blocks(tmp_path: Path) -> None:
    # pieces(begin, end) against a direct walk over every document of the epoch: ranges inside a document, across
    # documents and across blocks, with and without an appended EOD
    from datahub.loader.packing import TokenFiles, TokenLayout

    prefixes, _ = write_tokens(tmp_path / "tok", files=5, documents=17, max_len=30)
    rng = np.random.default_rng(4)
    for append_eod in (None, 0):
        layout = TokenLayout(TokenFiles.open(prefixes, append_eod=append_eod), seed=1, epoch=0, shuffle=True,
                             shuffle_buffer=30)
        documents = []  # (stream offset, length, file, first token) of every document in stream order
        for block in range(len(layout.block_starts) - 1):
            cumulative, file_of, starts = layout._block(block)
            base = int(layout.block_starts[block])
            documents += [(base + int(a), int(b - a), int(f), int(s))
                          for a, b, f, s in zip(cumulative[:-1], cumulative[1:], file_of, starts)]
        assert len(layout.block_starts) > 3
        for _ in range(300):
            begin = int(rng.integers(0, layout.num_tokens))
            end = min(layout.num_tokens, begin + int(rng.integers(1, 120)))
            want = []
            for at, length, f, first in documents:
                lo, hi = max(at, begin), min(at + length, end)
                if lo < hi:
                    want.append((f, first + lo - at, hi - lo, lo, append_eod is not None and hi == at + length))
            assert layout.pieces(begin, end) == want, (begin, end)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_pad_token_minus_1_pads_uint16_and_int32_files(tmp_path: Path, dtype: Any) -> None:
    """Megatron-LM pads with -1 and writes uint16 files for vocabularies < 65500: the compact batch buffer must
    widen to the batches' int32 tokens instead of overflowing the files' dtype."""
    from datahub.shards.indexed import IndexedWriter

    prefix = str(tmp_path / "tok")
    with IndexedWriter(prefix, dtype=dtype) as writer:
        writer.add_documents(np.arange(1, 16).astype(dtype), [5, 3, 7], ["d0", "d1", "d2"])
    for batch_size in (None, 2):
        batches = [{k: np.asarray(v) for k, v in b.items()}
                   for b in PackedDataset([prefix], seq_len=4, pad_token=-1, shuffle=False, batch_size=batch_size)]
        last = batches[-1]["tokens"].reshape(-1, 4)[-1]
        mask = batches[-1]["loss_mask"].reshape(-1, 4)[-1]
        assert last.tolist() == [13, 14, 15, -1] and mask.tolist() == [True, True, True, False]
        assert sorted(t for b in batches for t in real_tokens(b)) == list(range(1, 16))
    # Llama 3's pad id (128004) is above uint16 and uint32's min_scalar_type but fits the int32 batches
    wide = [{k: np.asarray(v) for k, v in b.items()}
            for b in PackedDataset([prefix], seq_len=4, pad_token=128004, shuffle=False, batch_size=2)]
    assert wide[-1]["tokens"].reshape(-1, 4)[-1].tolist() == [13, 14, 15, 128004]
    for bad in (2**31, -2**31 - 1, 2**40):
        with pytest.raises(ValueError, match="pad_token"):
            PackedDataset([prefix], seq_len=4, pad_token=bad)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_stateful_dataloader_workers_read_an_epoch_and_resume_token_exact(
        corpus: tuple[list[str], int], workers: int) -> None:
    """torchdata's StatefulDataLoader asks each worker's dataset copy for state_dict() (no consumed=): that must not
    raise ConsumedCountRequiredError in the worker, and the saved per-worker positions resume the same sequence."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    prefixes, total = corpus

    def loader() -> Any:
        return stateful.StatefulDataLoader(PackedDataset(prefixes, **SETTINGS), batch_size=None, num_workers=workers)

    def tokens(batches: Any) -> list[list[int]]:
        return [real_tokens({k: np.asarray(v) for k, v in batch.items()}) for batch in batches]

    full = tokens(loader())
    assert sorted(t for batch in full for t in batch) == list(range(1, total + 1))
    for head_items in (1, 5, len(full) - 1):
        first = loader()
        iterator = iter(first)
        head = tokens(itertools.islice(iterator, head_items))
        state = first.state_dict()
        del iterator
        fresh = loader()
        fresh.load_state_dict(state)
        assert head + tokens(fresh) == full, f"resume after {head_items} batches"


def _two_tier_token_manifest(corpus: tuple[list[str], int], root: Path) -> tuple[Path, list[str]]:
    """A token manifest whose files have full replicas on two local tiers: cfs (the corpus) and a copy on nvme."""
    import hashlib
    import shutil

    from datahub.shards.token_manifest import FilePart, TokenFileRecord, TokenizerInfo, TokenManifest

    prefixes, _ = corpus
    (root / "nvme").mkdir(parents=True)
    records, first, copies = [], 0, []
    for prefix in prefixes:
        copy = str(root / "nvme" / Path(prefix).name)
        for suffix in (".bin", ".idx", ".ids"):
            shutil.copy(prefix + suffix, copy + suffix)
        copies.append(copy)

        def part(path: str) -> FilePart:
            data = Path(path).read_bytes()
            return FilePart(len(data), hashlib.sha256(data).hexdigest())

        documents = len(Path(prefix + ".ids").read_text().splitlines())
        records.append(TokenFileRecord(prefix=Path(prefix).name, documents=documents,
                                       tokens=Path(prefix + ".bin").stat().st_size // 4, first_document=first,
                                       bin=part(prefix + ".bin"), idx=part(prefix + ".idx"), ids=part(prefix + ".ids"),
                                       replicas={"cfs": prefix, "nvme": f"file://{copy}"}))
        first += documents
    manifest = TokenManifest(release="tok-v1", created="2026-12-04T00:00:00Z", table="samples", table_version=1,
                             release_digest="ab" * 32, shuffle_seed=0, dtype="int32", files=tuple(records),
                             tokenizer=TokenizerInfo(sha256="cd" * 32, vocab_size=10**6, eod_id=0, eod_token="</s>"))
    path = root / "tokens-manifest.json"
    path.write_bytes(manifest.to_json())
    return path, copies


@pytest.mark.parametrize("damage", ["same_size_bytes", "missing_bin", "truncated_idx", "missing_ids"])
def test_token_manifest_damaged_or_missing_replica_fails_over_to_the_next_tier(
        corpus: tuple[list[str], int], tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A token file's replica is checked against the manifest (size, sha256) like a shard: a damaged one was read
    silently (wrong token ids in training batches) and a missing one raised FileNotFoundError although the next
    tier held a good copy."""
    import logging

    from datahub.loader.errors import NoReadableReplicaError

    prefixes, total = corpus
    path, copies = _two_tier_token_manifest(corpus, tmp_path / "tiers")
    target = prefixes[1]
    if damage == "same_size_bytes":
        data = bytearray(Path(target + ".bin").read_bytes())
        data[0:4] = np.int32(999_999).tobytes()  # a valid token id, same size: only the sha256 tells
        Path(target + ".bin").write_bytes(bytes(data))
    elif damage == "missing_bin":
        os.unlink(target + ".bin")
    elif damage == "truncated_idx":
        os.truncate(target + ".idx", os.path.getsize(target + ".idx") - 8)
    else:
        os.unlink(target + ".ids")
    with caplog.at_level(logging.WARNING, logger="datahub.loader"):
        dataset = PackedDataset(str(path), tier_preference=["cfs", "nvme"], **SETTINGS)
    assert [f.prefix for f in dataset.files.files] == [p if p != target else copies[1] for p in prefixes]
    tokens, _ = read_all(dataset)
    assert sorted(tokens) == list(range(1, total + 1))
    lines = [r.getMessage() for r in caplog.records if "token file" in r.getMessage()]
    assert len(lines) == 1 and "cfs" in lines[0] and Path(target).name in lines[0]
    # sizes are checked without verify; a same-size change needs the sha256
    unverified = PackedDataset(str(path), tier_preference=["cfs", "nvme"], verify=False, **SETTINGS)
    used = [f.prefix for f in unverified.files.files][1]
    assert used == (target if damage == "same_size_bytes" else copies[1])
    # no good replica anywhere: one error naming each tier's problem
    os.unlink(copies[1] + ".bin")
    with pytest.raises(NoReadableReplicaError) as error:
        PackedDataset(str(path), tier_preference=["cfs", "nvme"], **SETTINGS)
    assert "cfs (" in str(error.value) and "nvme (" in str(error.value) and Path(target).name in str(error.value)


def test_token_manifest_replicas_are_hashed_once_per_verdict_store(
        corpus: tuple[list[str], int], tmp_path: Path, verdict_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    import datahub.loader.token_replicas as token_replicas

    path, _ = _two_tier_token_manifest(corpus, tmp_path / "tiers")
    hashed: list[int] = []
    real_sha256 = hashlib.sha256

    def counting_sha256(data: Any = b"") -> Any:
        hashed.append(len(data))
        return real_sha256(data)

    from types import SimpleNamespace

    monkeypatch.setattr(token_replicas, "hashlib", SimpleNamespace(sha256=counting_sha256))  # this module's hashes only
    PackedDataset(str(path), **SETTINGS)
    assert len(hashed) == 3 * len(corpus[0])  # .bin, .idx, .ids of each file, on the first use
    assert len(list(verdict_store.iterdir())) >= 3 * len(corpus[0])
    PackedDataset(str(path), **SETTINGS)
    assert len(hashed) == 3 * len(corpus[0]), "a later dataset trusts the verdicts"
    PackedDataset(str(path), verify="always", **SETTINGS)
    assert len(hashed) == 6 * len(corpus[0])


def test_a_missing_token_manifest_or_a_text_manifest_says_which_file_to_give(tmp_path: Path) -> None:
    from datahub.loader.errors import ManifestError

    with pytest.raises(ManifestError, match=r"nope/tokens-manifest.json: no such token manifest; give the "
                                            r"tokens-manifest.json that `datahub export --tokenizer` writes"):
        PackedDataset(str(tmp_path / "nope" / "tokens-manifest.json"), **SETTINGS)
    text = tmp_path / "manifest.json"  # what `datahub export` without --tokenizer publishes next to the shards
    text.write_text(json.dumps({"manifest_version": 1, "release": "r", "shards": [{"name": "r-000000.tar"}]}))
    with pytest.raises(ManifestError, match=r"manifest.json: the manifest of a text export .*, not of token files"):
        PackedDataset(str(text), **SETTINGS)


def test_one_token_tier_given_as_a_string_is_that_tier(corpus: tuple[list[str], int], tmp_path: Path) -> None:
    path, copies = _two_tier_token_manifest(corpus, tmp_path / "tiers")
    dataset = PackedDataset(str(path), tier_preference="nvme", **SETTINGS)  # not the tiers 'n', 'v', 'm', 'e'
    assert [f.prefix for f in dataset.files.files] == copies


def _layout_before_reading(worker_id: int) -> None:  # worker_init_fn: what the worker's copy holds at its start
    from torch.utils.data import get_worker_info

    dataset = get_worker_info().dataset
    built = dataset._layout is not None and dataset._layout_epoch == dataset.epoch and bool(dataset._layout._blocks)
    with open(os.environ["DATAHUB_TEST_LAYOUT_LOG"], "a") as log:
        log.write(f"{os.getpid()} {built}\n")


def test_fresh_workers_share_the_owners_layout_and_persistent_ones_build_their_own(
        corpus: tuple[list[str], int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner builds an epoch's layout (and the block at its resume point) when its position is set, so forked
    workers inherit it instead of each building its own every epoch; the order read is the same. While persistent
    workers live, set_epoch leaves the layout to them (they were forked before), and a pickled copy (a spawned
    worker's) carries none."""
    import pickle

    prefixes, _ = corpus
    log = tmp_path / "layout.log"
    monkeypatch.setenv("DATAHUB_TEST_LAYOUT_LOG", str(log))
    reference = [b["tokens"].tolist() for b in PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)]
    dataset = PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)
    assert dataset._layout is not None and dataset._layout_epoch == SETTINGS["epoch"]
    assert pickle.loads(pickle.dumps(dataset))._layout is None
    loader = DataLoader(dataset, batch_size=None, num_workers=2, worker_init_fn=_layout_before_reading)
    assert sorted(b["tokens"].tolist() for b in loader) == sorted(reference)
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["True", "True"]

    persistent = PackedDataset(prefixes, rank=0, world_size=1, **SETTINGS)
    loader = DataLoader(persistent, batch_size=None, num_workers=2, persistent_workers=True)
    first = sorted(b["tokens"].tolist() for b in loader)
    persistent.set_epoch(5)
    assert persistent._layout_epoch == SETTINGS["epoch"], "live persistent workers build epoch 5's layout themselves"
    fifth = sorted(b["tokens"].tolist() for b in loader)
    assert first == sorted(reference)
    assert fifth == sorted(b["tokens"].tolist() for b in PackedDataset(prefixes, rank=0, world_size=1,
                                                                        **{**SETTINGS, "epoch": 5}))

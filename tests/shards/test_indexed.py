"""datahub.shards.indexed against a reader written here from Megatron-LM's format (struct + numpy)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from datahub.errors import IntegrityError
from datahub.shards.indexed import (IndexedDataset, IndexedWriter, decode_ids, encode_ids, encode_index, pack_documents,
                                    token_dtype)

CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def spec_read(bin_bytes: bytes, idx_bytes: bytes) -> tuple[type, list[np.ndarray], np.ndarray]:
    """Megatron-LM's _IndexReader + _MMapBinReader, independently: (dtype, sequences, document_indices)."""
    assert idx_bytes[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", idx_bytes[9:17])
    assert version == 1
    dtype = CODES[idx_bytes[17]]
    sequences, documents = struct.unpack("<QQ", idx_bytes[18:34])
    offset = 34
    lengths = np.frombuffer(idx_bytes, "<i4", sequences, offset)
    offset += 4 * sequences
    pointers = np.frombuffer(idx_bytes, "<i8", sequences, offset)
    offset += 8 * sequences
    doc_idx = np.frombuffer(idx_bytes, "<i8", documents, offset)
    assert offset + 8 * documents == len(idx_bytes)
    out = [np.frombuffer(bin_bytes, np.dtype(dtype).newbyteorder("<"), int(n), int(p)) for n, p in zip(lengths, pointers)]
    return dtype, out, doc_idx


def test_pack_matches_the_spec_reader(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50_000, size=n) for n in (5, 1, 0, 17, 3)]
    ids = [f"s{i:03d}" for i in range(len(docs))]
    files = pack_documents(np.concatenate(docs), np.array([len(d) for d in docs]), dtype=np.uint16, sample_ids=ids)
    dtype, sequences, doc_idx = spec_read(files.bin, files.idx)
    assert dtype is np.uint16
    assert [s.tolist() for s in sequences] == [d.tolist() for d in docs]
    assert doc_idx.tolist() == [0, 1, 2, 3, 4, 5]
    assert files.ids == b"s000\ns001\ns002\ns003\ns004\n"
    assert (files.documents, files.tokens) == (5, 26)

    (tmp_path / "a.bin").write_bytes(files.bin)
    (tmp_path / "a.idx").write_bytes(files.idx)
    (tmp_path / "a.ids").write_bytes(files.ids)
    dataset = IndexedDataset(tmp_path / "a")
    assert len(dataset) == 5 and dataset.num_documents == 5 and dataset.num_tokens == 26
    assert [dataset[i].tolist() for i in range(5)] == [d.tolist() for d in docs]
    assert dataset[-1].tolist() == docs[-1].tolist()
    assert dataset.document(3).tolist() == docs[3].tolist()
    assert dataset.sample_ids.to_pylist() == ids
    assert dataset.sequence_lengths.tolist() == [5, 1, 0, 17, 3]
    with pytest.raises(IndexError):
        dataset[5]


def test_streaming_writer_equals_in_memory_pack(tmp_path: Path) -> None:
    docs = [np.arange(n, dtype=np.int64) * 70_001 for n in (3, 4, 2)]
    with IndexedWriter(tmp_path / "w", dtype=token_dtype(100_000)) as writer:
        writer.add(docs[0], "a")
        writer.add_documents(np.concatenate(docs[1:]), [4, 2], ["b", "c"])
    files = pack_documents(np.concatenate(docs), np.array([3, 4, 2]), dtype=np.int32, sample_ids=["a", "b", "c"])
    assert (tmp_path / "w.bin").read_bytes() == files.bin
    assert (tmp_path / "w.idx").read_bytes() == files.idx
    assert (tmp_path / "w.ids").read_bytes() == files.ids
    dtype, sequences, _ = spec_read(files.bin, files.idx)
    assert dtype is np.int32 and sequences[1].tolist() == docs[1].tolist()
    assert not list(tmp_path.glob("*.tmp"))


def test_multi_sequence_documents_and_buffers() -> None:
    lengths = [2, 3, 1]
    idx = encode_index(lengths, dtype=np.uint16, document_indices=[0, 2, 3])
    body = np.arange(6, dtype="<u2").tobytes()
    dataset = IndexedDataset.from_buffers(body, idx)
    assert dataset.num_documents == 2 and len(dataset) == 3
    assert dataset.document(0).tolist() == [0, 1, 2, 3, 4]
    assert dataset.document(1).tolist() == [5]


def test_token_dtype_rule() -> None:
    assert token_dtype(32_000) == np.uint16 and token_dtype(65_499) == np.uint16
    assert token_dtype(65_500) == np.int32 and token_dtype(128_256) == np.int32


def test_damaged_files_are_refused(tmp_path: Path) -> None:
    files = pack_documents(np.arange(10), np.array([4, 6]), dtype=np.uint16, sample_ids=["a", "b"])
    with pytest.raises(IntegrityError, match="truncated"):
        IndexedDataset.from_buffers(files.bin, files.idx[:-3])
    with pytest.raises(IntegrityError, match="not a Megatron"):
        IndexedDataset.from_buffers(files.bin, b"XXXXXXXXX" + files.idx[9:])
    with pytest.raises(IntegrityError, match="points past"):
        IndexedDataset.from_buffers(files.bin[:-4], files.idx)
    with pytest.raises(IntegrityError, match="do not fit"):
        pack_documents(np.array([70_000]), np.array([1]), dtype=np.uint16, sample_ids=["a"])
    with pytest.raises(FileNotFoundError, match="prefix"):
        IndexedDataset(tmp_path / "missing")
    with pytest.raises(IntegrityError, match="truncated"):
        decode_ids(b"a\nb")


def test_ids_round_trip() -> None:
    ids = pa.chunked_array([["x", "y"], ["z"]])
    assert encode_ids(ids) == b"x\ny\nz\n"
    assert decode_ids(encode_ids(ids)).to_pylist() == ["x", "y", "z"]
    assert encode_ids([]) == b"" and decode_ids(b"").to_pylist() == []
    with pytest.raises(IntegrityError, match="newline"):
        encode_ids(["a\nb"])


def test_sequences_by_slice_as_megatron_reads_them_and_a_bad_index_named(tmp_path: Path) -> None:
    # Megatron-LM's IndexedDataset takes a slice (a list of sequences); ours raised TypeError "'<=' not supported
    # between instances of 'int' and 'slice'"
    docs = [np.arange(n, dtype=np.int64) + 10 * n for n in (3, 4, 2, 5)]
    with IndexedWriter(tmp_path / "s", dtype=np.uint16) as writer:
        writer.add_documents(np.concatenate(docs), [len(d) for d in docs], ["a", "b", "c", "d"])
    dataset = IndexedDataset(str(tmp_path / "s"))
    assert [s.tolist() for s in dataset[1:3]] == [d.tolist() for d in docs[1:3]]
    assert [s.tolist() for s in dataset[-2:]] == [d.tolist() for d in docs[-2:]]
    assert dataset[np.int64(1)].tolist() == docs[1].tolist()
    with pytest.raises(ValueError, match=r"s: slices of sequences take step 1"):
        dataset[::2]
    with pytest.raises(TypeError, match=r"s: a sequence index is an int or a slice; got str"):
        dataset["a"]  # type: ignore[call-overload]

"""Token shards in Megatron-LM's indexed dataset format (``PREFIX.bin`` + ``PREFIX.idx``), plus ``PREFIX.ids``.

Written from the format as Megatron-LM's ``megatron/core/datasets/indexed_dataset.py`` reads and writes it
(``_IndexWriter`` / ``_IndexReader``), so ``IndexedDataset(PREFIX)`` of Megatron-LM reads what we write:

``PREFIX.bin``: the tokens of every sequence back to back, little-endian, in the index's dtype, no header.

``PREFIX.idx`` (all integers little-endian):
- ``b"MMIDIDX\\x00\\x00"`` (9 bytes), version ``<Q`` = 1, dtype code ``<B`` (``DTYPE_CODES``);
- sequence count ``<Q`` (N), document-index count ``<Q`` (D + 1 for D documents);
- N sequence lengths (int32, tokens), N sequence pointers (int64, byte offsets into ``.bin``),
  D + 1 document indices (int64: ``[0, end of doc 0, end of doc 1, ...]`` in sequences);
- optionally N sequence modes (int8, multimodal datasets only; never written here).

datahub writes one sequence per document (as Megatron's ``preprocess_data.py`` does without sentence
splitting), each document's tokens followed by the tokenizer's end-of-document id, so
``document_indices == arange(D + 1)``; the reader accepts any valid file (several sequences per document).

``PREFIX.ids`` (datahub's side file, not Megatron's): the documents' ``sample_id`` in document order,
UTF-8, one per line, each line ended by ``\\n``. Plain text keeps its bytes independent of any library
version (the files are byte-reproducible and hashed in the token manifest) and readable by ``sed -n Kp``;
export keys never hold a newline (``^[A-Za-z0-9_-]{1,90}$``).
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, overload

import numpy as np
import pyarrow as pa

from datahub.errors import IntegrityError, SpecError

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# Megatron-LM's ``DType`` enum: the code stored in the index for the token dtype.
DTYPE_CODES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
    5: np.dtype(np.int64), 6: np.dtype(np.float64), 7: np.dtype(np.float32), 8: np.dtype(np.uint16),
}
# Megatron-LM's ``DType.optimal_dtype``: uint16 for a vocabulary below 65500 tokens, int32 otherwise.
UINT16_VOCAB_LIMIT = 65500
BIN_SUFFIX, IDX_SUFFIX, IDS_SUFFIX = ".bin", ".idx", ".ids"
_PREAMBLE = struct.Struct("<9sQBQQ")  # header, version, dtype code, sequence count, document-index count (34 bytes)
INDEX_PIECE = 1 << 20  # document indices made at a time by ``index_pieces`` (8 MiB)


def dtype_code(dtype: Any) -> int:
    """The index's code of a numpy dtype (``np.uint16`` -> 8)."""
    wanted = np.dtype(dtype)
    for code, known in DTYPE_CODES.items():
        if known == wanted:
            return code
    raise SpecError(f"token dtype {wanted}: Megatron's indexed format stores only {sorted(map(str, DTYPE_CODES.values()))}")


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """The token dtype for a vocabulary: uint16 below 65500 ids, int32 otherwise (Megatron-LM's rule)."""
    return np.dtype(np.uint16) if vocab_size < UINT16_VOCAB_LIMIT else np.dtype(np.int32)


def encode_index(sequence_lengths: np.ndarray | Sequence[int], *, dtype: Any,
                 document_indices: np.ndarray | Sequence[int] | None = None) -> bytes:
    """The ``.idx`` bytes for sequences of these lengths (tokens) in ``dtype``; ``document_indices`` default:
    one sequence per document (``arange(N + 1)``)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 0 or lengths.max() > np.iinfo(np.int32).max):
        raise IntegrityError("indexed dataset: a sequence length is negative or above 2**31-1 tokens")
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1] * itemsize, out=pointers[1:])
    documents = (np.arange(len(lengths) + 1, dtype=np.int64) if document_indices is None
                 else np.asarray(document_indices, dtype=np.int64))
    if not len(documents) or documents[0] != 0 or documents[-1] != len(lengths) or np.any(np.diff(documents) < 0):
        raise IntegrityError("indexed dataset: document_indices must rise from 0 to the sequence count")
    preamble = _PREAMBLE.pack(INDEX_HEADER, INDEX_VERSION, dtype_code(dtype), len(lengths), len(documents))
    return b"".join([preamble, lengths.astype("<i4").tobytes(), pointers.astype("<i8").tobytes(),
                     documents.astype("<i8").tobytes()])


def index_pieces(lengths: Callable[[], Iterable[np.ndarray]], *, count: int, dtype: Any) -> Iterator[bytes]:
    """The bytes of ``encode_index`` (one sequence per document) a piece at a time, for ``count`` sequences whose
    lengths ``lengths()`` gives a piece at a time: called twice (the lengths, then the pointers), so the index of a
    file of any number of documents (12 bytes each, and 8 more per document index) is never held whole."""
    itemsize = np.dtype(dtype).itemsize
    yield _PREAMBLE.pack(INDEX_HEADER, INDEX_VERSION, dtype_code(dtype), count, count + 1)
    given = 0
    for piece in lengths():
        piece = np.asarray(piece, dtype=np.int64)
        if piece.size and (piece.min() < 0 or piece.max() > np.iinfo(np.int32).max):
            raise IntegrityError("indexed dataset: a sequence length is negative or above 2**31-1 tokens")
        given += len(piece)
        yield piece.astype("<i4").tobytes()
    pointer = again = 0
    for piece in lengths():
        sizes = np.asarray(piece, dtype=np.int64) * itemsize
        if len(sizes):
            ends = np.cumsum(sizes) + pointer
            yield (ends - sizes).astype("<i8").tobytes()
            pointer, again = int(ends[-1]), again + len(sizes)
    if given != count or again != count:
        raise IntegrityError(f"indexed dataset: {given} and then {again} sequence lengths given for the {count} "
                             "sequences announced")
    for start in range(0, count + 1, INDEX_PIECE):
        yield np.arange(start, min(start + INDEX_PIECE, count + 1), dtype="<i8").tobytes()


_NEWLINE_WINDOW = 1 << 24  # id bytes compared at once (the comparison's mask is that large)


def holds_newline(sample_ids: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a sample_id holds a newline (it cannot go in a ``.ids`` file): one numpy scan of the ids' bytes,
    ~20x ``pc.match_substring`` on 64-character ids."""
    for chunk in sample_ids.chunks if isinstance(sample_ids, pa.ChunkedArray) else [sample_ids]:
        if not len(chunk):
            continue
        if chunk.type not in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()):
            chunk = chunk.cast(pa.string())
        wide = chunk.type in (pa.large_string(), pa.large_binary())
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if wide else np.int32)
        begin, end = int(offsets[chunk.offset]), int(offsets[chunk.offset + len(chunk)])
        data = chunk.buffers()[2]
        if data is None or end <= begin:
            continue
        values = np.frombuffer(data, dtype=np.uint8)
        if any(bool((values[at:min(at + _NEWLINE_WINDOW, end)] == 10).any())
               for at in range(begin, end, _NEWLINE_WINDOW)):
            return True
    return False


def encode_ids(sample_ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> bytes:
    """The ``.ids`` bytes: one sample_id per line, each ended by a newline."""
    ids = sample_ids if isinstance(sample_ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(sample_ids), pa.string())
    if not len(ids):
        return b""
    import pyarrow.compute as pc

    if ids.null_count or holds_newline(ids):
        raise IntegrityError("indexed dataset: a sample_id is null or holds a newline; it cannot go in a .ids file")
    joined = pc.binary_join_element_wise(ids.cast(pa.string()), pa.scalar("\n"), "")
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks()
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32)[joined.offset:joined.offset + len(joined) + 1]
    return bytes(memoryview(joined.buffers()[2])[int(offsets[0]):int(offsets[-1])])


def decode_ids(data: bytes | memoryview, *, where: str = ".ids") -> pa.Array:
    """The sample ids of a ``.ids`` file (a string array, one per document)."""
    raw = bytes(data)
    if not raw:
        return pa.array([], pa.string())
    if not raw.endswith(b"\n"):
        raise IntegrityError(f"{where}: the last line has no newline; the file is truncated, re-export it")
    return pa.array(raw[:-1].decode("utf-8").split("\n"), pa.string())


@dataclass(frozen=True)
class IndexedFiles:
    """One token file's three parts, built in memory (an engine task publishes them whole)."""

    bin: bytes
    idx: bytes
    ids: bytes
    documents: int
    tokens: int


def pack_documents(tokens: np.ndarray, lengths: np.ndarray, *, dtype: Any,
                   sample_ids: pa.Array | pa.ChunkedArray | Sequence[str]) -> IndexedFiles:
    """The files of documents given as one flat token array and each document's length (one sequence each)."""
    flat = np.asarray(tokens)
    lengths = np.asarray(lengths, dtype=np.int64)
    if int(lengths.sum()) != len(flat):
        raise IntegrityError(f"indexed dataset: lengths sum to {int(lengths.sum())} tokens, {len(flat)} given")
    if len(sample_ids) != len(lengths):
        raise IntegrityError(f"indexed dataset: {len(sample_ids)} sample ids for {len(lengths)} documents")
    body = _as_dtype(flat, dtype).tobytes()
    return IndexedFiles(bin=body, idx=encode_index(lengths, dtype=dtype), ids=encode_ids(sample_ids),
                        documents=len(lengths), tokens=len(flat))


def _as_dtype(tokens: np.ndarray, dtype: Any) -> np.ndarray:
    """Tokens in the file's dtype (little-endian), refusing ids that do not fit rather than wrapping them."""
    target = np.dtype(dtype).newbyteorder("<")
    if tokens.size and np.issubdtype(target, np.integer) and tokens.dtype != target:
        info = np.iinfo(target)
        if int(tokens.min()) < info.min or int(tokens.max()) > info.max:
            raise IntegrityError(f"indexed dataset: token ids {int(tokens.min())}..{int(tokens.max())} do not fit "
                                 f"{target}; use int32 tokens for this vocabulary")
    return tokens.astype(target, copy=False)


class IndexedWriter:
    """Stream documents into ``PREFIX.bin`` on local disk; ``close`` writes ``PREFIX.idx`` and ``PREFIX.ids``.

    Memory: the lengths and ids (a few bytes per document), never the tokens. Files appear at their final
    names only on a clean close (written as ``*.tmp`` and renamed), so a crash leaves no half-file behind.
    """

    def __init__(self, prefix: str | os.PathLike[str], *, dtype: Any) -> None:
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)
        self._bin = open(self.prefix + BIN_SUFFIX + ".tmp", "wb")  # noqa: SIM115 - closed in close()
        self._lengths: list[np.ndarray] = []
        self._ids: list[pa.Array] = []

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray | Sequence[int],
                      sample_ids: pa.Array | Sequence[str]) -> None:
        """Append documents given as one flat token array, their lengths and their sample ids."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens) or len(sample_ids) != len(lengths):
            raise IntegrityError(f"{self.prefix}: {len(tokens)} tokens, lengths summing to {int(lengths.sum())} and "
                                 f"{len(sample_ids)} ids for {len(lengths)} documents do not agree")
        self._bin.write(_as_dtype(np.asarray(tokens), self.dtype).tobytes())
        self._lengths.append(lengths)
        ids = sample_ids if isinstance(sample_ids, pa.Array) else pa.array(list(sample_ids), pa.string())
        self._ids.append(ids.cast(pa.string()))

    def add(self, document: np.ndarray | Sequence[int], sample_id: str) -> None:
        """Append one document."""
        tokens = np.asarray(document)
        self.add_documents(tokens, [len(tokens)], [sample_id])

    def close(self) -> IndexedFiles:
        """Write the index and the ids, publish the three files; returns their sizes (``bin``/``idx``/``ids``
        empty: the bytes are on disk)."""
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        ids = pa.concat_arrays(self._ids) if self._ids else pa.array([], pa.string())
        for suffix, data in ((IDX_SUFFIX, encode_index(lengths, dtype=self.dtype)), (IDS_SUFFIX, encode_ids(ids))):
            Path(self.prefix + suffix + ".tmp").write_bytes(data)
        for suffix in (BIN_SUFFIX, IDX_SUFFIX, IDS_SUFFIX):
            os.replace(self.prefix + suffix + ".tmp", self.prefix + suffix)
        return IndexedFiles(b"", b"", b"", documents=len(lengths), tokens=int(lengths.sum()))

    def abort(self) -> None:
        self._bin.close()
        for suffix in (BIN_SUFFIX, IDX_SUFFIX, IDS_SUFFIX):
            Path(self.prefix + suffix + ".tmp").unlink(missing_ok=True)

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


@dataclass(frozen=True)
class Index:
    """The arrays of a ``.idx`` file (views into its buffer)."""

    dtype: np.dtype[Any]
    sequence_lengths: np.ndarray  # int32, tokens per sequence
    sequence_pointers: np.ndarray  # int64, byte offset of each sequence in .bin
    document_indices: np.ndarray  # int64, D + 1 sequence indices: [0, end of doc 0, ...]
    sequence_modes: np.ndarray | None  # int8 (multimodal) or None


def read_index(buffer: Any, *, where: str = ".idx", multimodal: bool = False) -> Index:
    """Parse ``.idx`` bytes (bytes, memoryview, mmap), checking header, version, dtype and sizes."""
    view = memoryview(buffer).cast("B")
    if len(view) < _PREAMBLE.size:
        raise IntegrityError(f"{where}: {len(view)} bytes is shorter than the 34-byte index header; not an indexed dataset")
    header, version, code, sequences, documents = _PREAMBLE.unpack_from(view, 0)
    if header != INDEX_HEADER:
        raise IntegrityError(f"{where}: starts with {bytes(header)!r}, not {INDEX_HEADER!r}; not a Megatron .idx file")
    if version != INDEX_VERSION:
        raise IntegrityError(f"{where}: index version {version}, this reader knows {INDEX_VERSION}")
    if code not in DTYPE_CODES:
        raise IntegrityError(f"{where}: unknown dtype code {code} (known: {sorted(DTYPE_CODES)})")
    need = _PREAMBLE.size + sequences * (4 + 8 + (1 if multimodal else 0)) + documents * 8
    if len(view) < need:
        raise IntegrityError(f"{where}: {len(view)} bytes, the header announces {need}; the file is truncated, re-export it")
    offset = _PREAMBLE.size
    lengths = np.frombuffer(view, dtype="<i4", count=sequences, offset=offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(view, dtype="<i8", count=sequences, offset=offset)
    offset += pointers.nbytes
    document_indices = np.frombuffer(view, dtype="<i8", count=documents, offset=offset)
    offset += document_indices.nbytes
    modes = np.frombuffer(view, dtype=np.int8, count=sequences, offset=offset) if multimodal else None
    if documents and (document_indices[0] != 0 or document_indices[-1] != sequences):
        raise IntegrityError(f"{where}: document indices run {document_indices[0]}..{document_indices[-1]}, "
                             f"not 0..{sequences}; the index is damaged")
    return Index(DTYPE_CODES[code], lengths, pointers, document_indices, modes)


class IndexedDataset:
    """Read a Megatron indexed dataset: ``len`` sequences, ``ds[i]`` the tokens of sequence i (a read-only view).

    ``prefix``: a local path without suffix (files are memory-mapped) or use :meth:`from_buffers` for bytes
    fetched from a remote tier. With datahub's files a sequence is a document (its tokens and the EOD id) and
    ``sample_ids[i]`` names it.
    """

    def __init__(self, prefix: str | os.PathLike[str], *, multimodal: bool = False) -> None:
        self.prefix = str(prefix)
        for suffix in (BIN_SUFFIX, IDX_SUFFIX):
            if not os.path.exists(self.prefix + suffix):
                raise FileNotFoundError(f"{self.prefix}{suffix}: no such file; give the path prefix without .bin/.idx")
        idx = _map(self.prefix + IDX_SUFFIX)
        data = _map(self.prefix + BIN_SUFFIX)
        ids_path = self.prefix + IDS_SUFFIX
        ids = Path(ids_path).read_bytes() if os.path.exists(ids_path) else None
        self._init(data, read_index(idx, where=self.prefix + IDX_SUFFIX, multimodal=multimodal), ids)

    @classmethod
    def from_buffers(cls, bin: Any, idx: Any, ids: bytes | None = None, *, where: str = "<buffers>",
                     multimodal: bool = False) -> IndexedDataset:
        """A dataset over bytes already in memory (e.g. read from an object store)."""
        dataset = cls.__new__(cls)
        dataset.prefix = where
        dataset._init(memoryview(bin).cast("B"), read_index(idx, where=where + IDX_SUFFIX, multimodal=multimodal), ids)
        return dataset

    def _init(self, data: Any, index: Index, ids: bytes | None) -> None:
        self.index = index
        itemsize = index.dtype.itemsize
        if len(data) % itemsize:
            raise IntegrityError(f"{self.prefix}{BIN_SUFFIX}: {len(data)} bytes is not a whole number of "
                                 f"{index.dtype} tokens")
        count = len(data) // itemsize
        self.tokens: np.ndarray = np.frombuffer(data, dtype=index.dtype.newbyteorder("<"), count=count)
        lengths, pointers = index.sequence_lengths, index.sequence_pointers
        if len(lengths) and int(pointers[-1]) + int(lengths[-1]) * itemsize > len(data):
            raise IntegrityError(f"{self.prefix}{BIN_SUFFIX}: {len(data)} bytes, the index points past it; "
                                 "the .bin is truncated or belongs to another index")
        self._ids_bytes = ids
        self._sample_ids: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.index.sequence_lengths)

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        """Sequence ``i`` (views of the .bin), or a list of them for a slice of step 1, as Megatron-LM's class."""
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                raise ValueError(f"{self.prefix}: slices of sequences take step 1 (as Megatron-LM's); got {i}")
            return [self[j] for j in range(start, stop)]
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"{self.prefix}: a sequence index is an int or a slice; got {type(i).__name__}") from None
        if not -len(self) <= i < len(self):
            raise IndexError(f"{self.prefix}: sequence {i} of {len(self)}")
        i = i % len(self)
        start = int(self.index.sequence_pointers[i]) // self.index.dtype.itemsize
        return self.tokens[start:start + int(self.index.sequence_lengths[i])]

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.index.dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self.index.sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self.index.sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        """D + 1 sequence indices: document d is sequences ``document_indices[d]:document_indices[d + 1]``."""
        return self.index.document_indices

    @property
    def num_documents(self) -> int:
        return max(len(self.index.document_indices) - 1, 0)

    @property
    def num_tokens(self) -> int:
        return int(self.index.sequence_lengths.sum(dtype=np.int64))

    def document(self, d: int) -> np.ndarray:
        """The tokens of document ``d`` (its sequences joined; a view when they are contiguous, as ours are)."""
        first, last = int(self.document_indices[d]), int(self.document_indices[d + 1])
        if first == last:
            return self.tokens[:0]
        start = int(self.index.sequence_pointers[first]) // self.index.dtype.itemsize
        end = int(self.index.sequence_pointers[last - 1]) // self.index.dtype.itemsize + int(self.index.sequence_lengths[last - 1])
        return self.tokens[start:end]

    @property
    def sample_ids(self) -> pa.Array:
        """The documents' sample ids (from ``PREFIX.ids``), one per document."""
        if self._sample_ids is None:
            if self._ids_bytes is None:
                raise FileNotFoundError(f"{self.prefix}{IDS_SUFFIX}: no sample ids beside this dataset "
                                        "(files written by datahub export have them)")
            ids = decode_ids(self._ids_bytes, where=self.prefix + IDS_SUFFIX)
            if len(ids) != self.num_documents:
                raise IntegrityError(f"{self.prefix}{IDS_SUFFIX}: {len(ids)} ids for {self.num_documents} documents; "
                                     "the files are from different exports, re-export")
            self._sample_ids = ids
        return self._sample_ids


def _map(path: str) -> Any:
    """A read-only memory map of a file (an empty file maps to empty bytes: mmap refuses length 0)."""
    if os.path.getsize(path) == 0:
        return memoryview(b"")
    return np.memmap(path, dtype=np.uint8, mode="r").data

"""Tokenize a frozen table version at export: Megatron indexed token files (``.bin``/``.idx`` + ``.ids``) on a tier.

``export_tokens(lake, RELEASE, tokenizer=PATH, tier=...)`` writes ``{release}/tokens-{sha12}/{release}-NNNNNN.*``
(format: ``datahub.shards.indexed``; manifest: ``datahub.shards.token_manifest``). A document is the tokenizer's
ids of a sample's ``text`` (``encode_batch``, ``add_special_tokens`` off by default) followed by the EOD id; the
documents follow the release's export order (``datahub.export.plan``: by sample_id, or the keyed hash of
``shuffle_seed``), the very order of the text export, and a file holds a contiguous range of it.

Flow (the release is never held in one process, nor its ids: the driver plans on local disk):
1. count: every data file of the version is tokenized once (engine tasks, or this process); its tokens are
   staged (``Staging``: a local temp folder, or the tier's ``_partial`` folder that every engine task reaches)
   and only ``(sample_id, tokens)`` comes back; the driver orders the documents and cuts files at ``file_tokens``
   on local disk, key bucket by key bucket (``datahub.export.plan.SummaryPlan``, as the text export);
2. write: every staged data file is read back and each document routed to its file by the files' first keys
   (``ShardRouter``). In this process they are routed to runs of about ``CHUNK_BYTES`` of their file's export
   order (``FileChunks``) and spilled to local disk by run, and a file is streamed a run at a time
   (``StreamedTokenFile``): ``.bin`` from the spill, ``.ids`` and ``.idx`` from the plan. On Ray they are routed to
   the same chunks and kept sorted on the workers' disks (``spill_runs``), and one task per file gathers its
   chunks one after the other (``write_pieces``); on Spark a file's documents are sorted by the shuffle in export
   order and streamed to one task in batches (``write_sorted``); an engine task writes ``.bin`` as the documents
   come and ``.ids``/``.idx`` from what it kept of them on its disk (``OrderedTokenFile``, the write seam's
   ``TokenFileWriter``). So a file's size (``file_tokens``) sets no process's memory. Each part's size and sha256
   come back;
3. lineage: ``exported`` events (ref: the file's prefix URI and the document's index in it), one commit;
4. the manifest, last: in the tier's token folder, then under the lake; the ``_partial`` folder is removed.

Same table version + tokenizer bytes + settings -> byte-identical files on every engine (tested). A killed export
is re-run: files journalled under ``tokens-{sha12}/_partial/{key}-{table id}/`` and verified at the destination are
kept (never another lake's); a re-run with other settings after the lineage commit is refused.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.config.spec import EngineSpec
from datahub.engines.base import Engine
from datahub.engines.registry import make_engine
from datahub.engines.sink import Sink
from datahub.errors import IntegrityError, MissingDependencyError, ReleaseError, SpecError
from datahub.export.exported_lineage import commit_exported, refuse_other_export
from datahub.export.plan import ORDER, BucketPlan, ShardRouter, ShardSpan, SummaryPlan, order_hash
from datahub.export.samples import KEY_COLUMN, TEXT_COLUMN
from datahub.export.scratch import TOKENS_PREFIX, scratch_dir, sweep_stale
from datahub.export.source import TableSource
from datahub.export.spill import ShardSpill, buckets_allowed
from datahub.lake.lake import Lake
from datahub.pipeline.faults import checkpoint
from datahub.release.records import get_release
from datahub.shards.indexed import (BIN_SUFFIX, IDS_SUFFIX, IDX_SUFFIX, encode_ids, encode_index, holds_newline,
                                    index_pieces, token_dtype)
from datahub.shards.token_manifest import (TOKEN_MANIFEST_NAME, FilePart, TokenFileRecord, TokenizerInfo, TokenManifest,
                                           publish_lake_token_manifest, read_lake_token_manifest, token_dir)
from datahub.storage.config import StorageConfig
from datahub.storage.tier import STALE_PARTIAL_S, Tier
from datahub.storage.tier_spec import CfsTier

__all__ = ["DEFAULT_FILE_TOKENS", "LoadedTokenizer", "export_table_tokens", "export_tokens", "load_tokenizer"]

DEFAULT_FILE_TOKENS = 2**27  # ~134M tokens a file: 256 MiB of uint16, the order of the text export's 256 MB shards
TOKENS_OP = "export-tokens@1"
FORMAT = "megatron-mmidx-1"
TOKENIZER_FILE = "tokenizer.json"
# End-of-document tokens of common tokenizers, tried in order when neither the caller nor tokenizer_config.json
# names one (GPT-2/NeoX, Llama/Mistral/T5, Llama 3, Gemma, others).
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|im_end|>")
BATCH_ROWS = 1024
LINEAGE_PIECE = 1 << 17  # exported events built at a time (a file may hold millions of documents)
_RELEASE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"

Progress = Callable[..., None]
EngineChoice = Literal["local", "ray", "spark"] | Engine

COUNTED = pa.schema([(KEY_COLUMN, pa.string()), ("tokens", pa.int64())])
# Staged documents (count pass -> write pass): the id and the document's tokens (EOD included) as little-endian
# bytes of the file's dtype.
STAGED = pa.schema([(KEY_COLUMN, pa.string()), ("tokens", pa.large_binary())])
# Routed documents: the file they belong to (named "shard" for ``ShardSpill``), the order hash bits (0 without a
# seed), the id and the document's tokens (EOD included) as little-endian bytes of the file's dtype.
ROUTED = pa.schema([("shard", pa.int64()), ("order_hash", pa.int64()), (KEY_COLUMN, pa.string()),
                    ("tokens", pa.large_binary())])


# ---- the tokenizer --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer by content (its JSON), picklable to engine tasks, and what the manifest records of it."""

    json: str
    info: TokenizerInfo

    @property
    def dtype(self) -> np.dtype[Any]:
        return token_dtype(self.info.vocab_size)

    def encode(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """The documents of ``texts`` (null: empty text): flat tokens in the file dtype, EOD after each, and
        their lengths (EOD included). One ``encode_batch`` call: the tokenizer's own threads do the work."""
        values = pc.fill_null(texts, "").to_pylist()
        tokenizer = _tokenizer(self.info.sha256, self.json)
        fast = getattr(tokenizer, "encode_batch_fast", None)  # tokenizers >= 0.20: no offsets computed
        encodings = (fast or tokenizer.encode_batch)(values, add_special_tokens=self.info.add_special_tokens)
        documents = [e.ids for e in encodings]  # each .ids access builds a new list: once
        lengths = np.fromiter(map(len, documents), dtype=np.int64, count=len(documents)) + 1
        total = int(lengths.sum())
        flat = np.empty(total, dtype=self.dtype.newbyteorder("<"))
        ends = np.cumsum(lengths) - 1
        body = np.ones(total, dtype=bool)
        body[ends] = False
        ids = np.fromiter(itertools.chain.from_iterable(documents), dtype=np.int64, count=total - len(ends))
        if ids.size and int(ids.max()) > np.iinfo(self.dtype).max:
            raise IntegrityError(f"tokenizer {self.info.sha256[:12]}: id {int(ids.max())} is past its vocab_size "
                                 f"{self.info.vocab_size}; the tokenizer file is inconsistent")
        flat[body] = ids
        flat[ends] = self.info.eod_id
        return flat, lengths


_LOADED: dict[str, Any] = {}  # sha256 -> tokenizers.Tokenizer, one per process (a task builds it once)


def _tokenizer(sha256: str, text: str) -> Any:
    if sha256 not in _LOADED:
        from tokenizers import Tokenizer

        _LOADED[sha256] = _whole_documents(Tokenizer.from_str(text))
    return _LOADED[sha256]


def _whole_documents(tokenizer: Any) -> Any:
    """A tokenizer.json may carry truncation or padding settings (e.g. max_length 512 for a classifier); an
    export tokenizes whole documents, unpadded."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def load_tokenizer(path: str | os.PathLike[str], *, eod_token: str | None = None,
                   add_special_tokens: bool = False) -> LoadedTokenizer:
    """A ``tokenizers`` JSON file, or a Hugging Face tokenizer directory holding ``tokenizer.json`` (read from
    disk, never downloaded). The EOD token: ``eod_token``, else the directory's ``tokenizer_config.json``
    ``eos_token``, else the first of ``EOD_CANDIDATES`` in the vocabulary."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingDependencyError("datahub export --tokenizer needs the tokenizers package: "
                                     "pip install 'datahub[tokens]' (or pip install tokenizers)") from None
    given = Path(path)
    if not given.exists():
        raise SpecError(f"--tokenizer {path}: no such file or directory; give a tokenizer.json file or a Hugging Face "
                        "tokenizer directory that holds one (downloads by name are not done at export time)")
    file = given / TOKENIZER_FILE if given.is_dir() else given
    if not file.is_file():
        present = ", ".join(sorted(p.name for p in given.iterdir())[:10]) or "nothing"
        raise SpecError(f"--tokenizer {path}: the directory has no {TOKENIZER_FILE} (it holds {present}); "
                        "save the tokenizer with tokenizer.save('tokenizer.json') or save_pretrained() of a fast tokenizer")
    raw = file.read_bytes()
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON (and UnicodeDecodeError)
        raise SpecError(f"--tokenizer {file}: not a tokenizers JSON file ({str(exc).splitlines()[0][:200]}); "
                        "give the tokenizer.json that tokenizers' Tokenizer.save writes") from None
    sha256 = hashlib.sha256(raw).hexdigest()
    chosen = eod_token or (_configured_eos(given) if given.is_dir() else None)
    candidates = [chosen] if chosen else list(EOD_CANDIDATES)
    for name in candidates:
        eod_id = tokenizer.token_to_id(name)
        if eod_id is not None:
            break
    else:
        raise SpecError(f"--tokenizer {file}: no end-of-document token: {'/'.join(candidates)} is not in the vocabulary; "
                        "name it with --eod-token")
    info = TokenizerInfo(sha256=sha256, vocab_size=int(tokenizer.get_vocab_size(with_added_tokens=True)),
                         eod_id=int(eod_id), eod_token=str(name), add_special_tokens=add_special_tokens,
                         source=str(path))
    _LOADED[sha256] = _whole_documents(tokenizer)
    return LoadedTokenizer(raw.decode("utf-8"), info)


def _configured_eos(directory: Path) -> str | None:
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text()).get("eos_token")
    except (ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


# ---- planning ------------------------------------------------------------------------------------------


def documents_array(flat: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """One large_binary value per document: its tokens' bytes (zero-copy over ``flat``)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths * flat.itemsize, out=offsets[1:])
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(lengths),
                                            [None, pa.py_buffer(offsets), pa.py_buffer(flat)])


@dataclass(frozen=True)
class Staging:
    """Where the count pass leaves each data file's tokens for the write pass, so text is tokenized once: a
    local temp folder for a local export, the target tier's ``_partial`` folder for engine tasks (every task
    reaches it). One Arrow IPC stream per data file: ``sample_id`` and the document's token bytes."""

    tier_name: str
    tier_spec: Any
    tier_source: str
    folder: str

    def tier(self) -> Tier:
        return Tier(self.tier_name, self.tier_spec, source=self.tier_source)

    def uri(self, file: str) -> str:
        return f"{self.folder}/{hashlib.sha256(file.encode()).hexdigest()[:16]}.arrow"

    @property
    def posix(self) -> bool:
        """A POSIX folder (a local temp folder, a cfs tier): streamed batch by batch, never held whole."""
        return isinstance(self.tier_spec, CfsTier)

    def write(self, file: str, tables: Iterable[pa.Table]) -> None:
        """Stage the tables of one data file (atomically: a re-run never reads half a file)."""
        uri = self.uri(file)
        if self.posix:
            os.makedirs(os.path.dirname(uri), exist_ok=True)
            with pa.OSFile(uri + ".tmp", "wb") as sink, pa.ipc.new_stream(sink, STAGED) as stream:
                for table in tables:
                    stream.write_table(table)
            os.replace(uri + ".tmp", uri)
            return
        buffer = pa.BufferOutputStream()
        with pa.ipc.new_stream(buffer, STAGED) as stream:
            for table in tables:
                stream.write_table(table)
        self.tier().publish(uri, buffer.getvalue().to_pybytes())

    def read(self, file: str) -> Iterator[pa.RecordBatch]:
        """The staged batches of one data file."""
        uri = self.uri(file)
        source = pa.memory_map(uri) if self.posix else pa.BufferReader(self.tier().read(uri))
        with source, pa.ipc.open_stream(source) as stream:
            yield from stream


@dataclass(frozen=True)
class StageTokens:
    """The count pass over one data file (a task): tokenize, stage the tokens, yield ``(sample_id, tokens)``."""

    source: TableSource
    tokenizer: LoadedTokenizer
    staging: Staging

    def __call__(self, file: str) -> Iterator[pa.Table]:
        counted: list[pa.Table] = []

        def staged() -> Iterator[pa.Table]:
            for batch in self.source.scan([KEY_COLUMN, TEXT_COLUMN], files=[file], batch_rows=BATCH_ROWS):
                if batch.num_rows:
                    flat, lengths = self.tokenizer.encode(batch.column(TEXT_COLUMN))
                    ids = batch.column(KEY_COLUMN).cast(pa.string())
                    counted.append(pa.table([ids, pa.array(lengths, pa.int64())], schema=COUNTED))
                    yield pa.table([ids, documents_array(flat, lengths)], schema=STAGED)

        self.staging.write(file, staged())
        yield from counted


def plan_files(counted: Iterable[pa.Table], *, shuffle_seed: int | None, file_tokens: int, where: str,
               directory: str, bucket_rows: int | None = None) -> BucketPlan:
    """Order documents as the text export does and cut files: a file closes before the document that would take
    it past ``file_tokens`` (a larger document gets a file of its own); the plan's ``sizes`` are tokens per
    document. Planned in ``directory`` on local disk, bucket by bucket (``SummaryPlan``): the driver holds a batch
    and one bucket of ids and counts, not the release's."""
    os.makedirs(directory, exist_ok=True)
    planner = SummaryPlan(directory, shuffle_seed=shuffle_seed, where=where, bucket_rows=bucket_rows,
                          max_buckets=buckets_allowed())
    try:
        for table in counted:
            if not table.num_rows:
                continue
            if table.column(KEY_COLUMN).null_count:
                raise IntegrityError(f"{where}: rows have a null sample_id; fix the table before exporting")
            if holds_newline(table.column(KEY_COLUMN)):
                raise IntegrityError(f"{where}: a sample_id holds a newline; it cannot go in a .ids file (one id a "
                                     "line): fix the table before exporting")
            planner.add(pa.table({KEY_COLUMN: table.column(KEY_COLUMN), "size": table.column("tokens")}))
        return planner.plan(cuts=FileCuts(file_tokens))
    finally:
        planner.close()


def cut_files(lengths: np.ndarray, *, file_tokens: int) -> tuple[ShardSpan, ...]:
    """Contiguous files of at most ``file_tokens`` tokens (a longer document alone), one search per file."""
    spans: list[ShardSpan] = []
    start = 0
    for take, _ in FileCuts(file_tokens).feed(lengths, True):
        spans.append(ShardSpan(len(spans), start, take))
        start += take
    return tuple(spans)


class FileCuts:
    """The token files' rule for ``plan.sort_buckets`` (a ``ShardCuts``): a file closes before the document that
    would take it past ``file_tokens`` (a longer document gets a file of its own). Fed documents' token counts a
    piece at a time, it cuts a file only where a document past it does not fit, and holds of the open file only
    its documents and tokens so far (two integers), not their records: the plan's memory does not grow with the
    file's size."""

    def __init__(self, file_tokens: int) -> None:
        self.file_tokens = file_tokens
        self._open_documents = 0
        self._open_tokens = 0

    def feed(self, lengths: np.ndarray, final: bool) -> list[tuple[int, int]]:
        held = self._open_documents
        # tokens before each document of the open file and this piece, counted from the open file's start
        cumulative = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) + self._open_tokens
        documents = held + len(lengths)
        cuts: list[tuple[int, int]] = []
        start, before = 0, 0  # the next file's first document (counted from the open file's) and tokens before it
        while start < documents:
            # the documents held so far all fit in one file: the first search ends at or past them
            end = held + int(np.searchsorted(cumulative, before + self.file_tokens, side="right")) - 1
            if not final and end >= documents:  # every document left fits: a later one may too
                break
            take = max(end - start, 1)
            cuts.append((take, int(cumulative[start + take - held]) - before))
            start += take
            before = int(cumulative[start - held])
        self._open_documents = documents - start
        self._open_tokens = int(cumulative[-1]) - before if self._open_documents else 0
        return cuts


# ---- writing -------------------------------------------------------------------------------------------


def _piece_ends(nbytes: np.ndarray) -> np.ndarray:
    """Where ``.bin`` pieces end (document counts, export order): a piece closes once it holds ``PIECE_BYTES`` (a
    larger document is a piece of its own), so one piece is copied at a time."""
    cumulative = np.cumsum(nbytes, dtype=np.int64)
    ends: list[int] = []
    done, start = 0, 0
    while start < len(nbytes):
        end = max(int(np.searchsorted(cumulative, done + PIECE_BYTES, side="right")), start + 1)
        ends.append(end)
        done, start = int(cumulative[end - 1]), end
    return np.asarray(ends, dtype=np.int64)


def file_prefix(release: str, index: int) -> str:
    return f"{release}-{index:06d}"


@dataclass(frozen=True)
class TokenFileDone:
    """One published token file (three parts): what the manifest, the journal and the lineage need."""

    index: int
    prefix: str
    documents: int
    tokens: int
    first_document: int
    bin: tuple[int, str]
    idx: tuple[int, str]
    ids: tuple[int, str]

    def record(self, replicas: dict[str, str]) -> TokenFileRecord:
        return TokenFileRecord(prefix=self.prefix, documents=self.documents, tokens=self.tokens,
                               first_document=self.first_document, bin=FilePart(*self.bin), idx=FilePart(*self.idx),
                               ids=FilePart(*self.ids), replicas=replicas)

    @classmethod
    def from_record(cls, index: int, record: TokenFileRecord) -> TokenFileDone:
        return cls(index, record.prefix, record.documents, record.tokens, record.first_document,
                   (record.bin.size, record.bin.sha256), (record.idx.size, record.idx.sha256),
                   (record.ids.size, record.ids.sha256))


PIECE_BYTES = 8 * 2**20  # ``.bin`` is written in pieces of about this size (ordered a piece at a time)
IDS_PIECE = 1 << 16  # ids encoded at a time for .ids (~4 MiB of 64-character ids)
# A local export spills a file's documents in runs of its export order of about this many routed bytes, and holds one
# run at a time (read back, about twice) while the file is written, whatever --file-tokens is.
CHUNK_BYTES = 32 * 2**20
CHUNK_DOCUMENT_BYTES = 48  # routed bytes of a document besides its tokens and id (file, hash, offsets, arrays' slack)
RECORDS_PIECE = 1 << 16  # plan records read at a time for a file's runs, .ids, .idx and lineage


def plan_records(plan: BucketPlan, start: int, count: int, *, step: int = RECORDS_PIECE) -> Iterator[pa.Table]:
    """The plan's records (``sample_id``, ``size`` in tokens, ``order_hash`` when seeded) of export ranks
    ``[start, start + count)`` in order, ``step`` at a time at most (one bucket of the plan loaded at a time)."""
    for begin in range(start, start + count, step):
        for _, records in plan.rows(begin, min(step, start + count - begin)):
            yield records


@dataclass(frozen=True)
class FileChunks:
    """The token files of a local export cut into runs of their export order (chunks) of about ``CHUNK_BYTES``
    routed bytes each (a larger document alone), so that a file is spilled and read back a run at a time: chunk
    ``c`` holds the documents of ranks ``starts[c]`` .. ``+ router.samples[c]``; file ``f`` holds chunks
    ``first[f]`` .. ``first[f + 1]``. The router routes a document to its chunk as the file router does to its
    file (every file begins a chunk)."""

    router: ShardRouter
    starts: tuple[int, ...]
    first: tuple[int, ...]  # files + 1

    def of_file(self, index: int) -> range:
        return range(self.first[index], self.first[index + 1])


def plan_chunks(plan: BucketPlan, *, itemsize: int, chunk_bytes: int | None = None) -> FileChunks:
    """Cut every file of ``plan`` into chunks (``FileChunks``) from its records: one pass over the plan, a piece of
    records held at a time. A chunk closes before the document that would take it past ``chunk_bytes`` (default
    ``CHUNK_BYTES``); a document's routed bytes are its tokens, its id and ``CHUNK_DOCUMENT_BYTES``."""
    limit = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    starts: list[int] = []
    first_ids: list[bytes] = []
    first_hashes: list[int] = []
    first = [0]
    seeded = False

    def begin(records: pa.Table, row: int, rank: int) -> None:
        starts.append(rank)
        first_ids.append(records.column(KEY_COLUMN)[row].as_py().encode())
        if "order_hash" in records.column_names:
            first_hashes.append(int(records.column("order_hash")[row].as_py()))

    for span in plan.spans:
        held = 0  # routed bytes of the open chunk (0: no document yet)
        rank = span.start
        for records in plan_records(plan, span.start, span.samples):
            seeded = "order_hash" in records.column_names
            if rank == span.start:
                begin(records, 0, rank)
            costs = (np.asarray(records.column("size"), dtype=np.int64) * itemsize + CHUNK_DOCUMENT_BYTES +
                     np.asarray(pc.binary_length(records.column(KEY_COLUMN)), dtype=np.int64))
            cumulative = np.cumsum(costs)
            row = 0
            while row < len(costs):
                before = int(cumulative[row - 1]) if row else 0
                fits = int(np.searchsorted(cumulative, before + limit - held, side="right"))  # rows row..fits-1 fit
                if fits == row and not held:
                    fits = row + 1  # a document larger than a chunk: a chunk of its own
                if fits >= len(costs):
                    held += int(cumulative[-1]) - before
                    break
                begin(records, fits, rank + fits)
                held, row = 0, fits
            rank += len(costs)
        first.append(len(starts))
    ends = [*starts[1:], plan.num_samples]
    samples = tuple(end - start for start, end in zip(starts, ends))
    router = ShardRouter(np.asarray(first_ids, dtype=bytes) if first_ids else np.asarray([], dtype="S1"),
                         np.asarray(first_hashes, dtype=np.uint64) if seeded else None, samples)
    return FileChunks(router, tuple(starts), tuple(first))


@dataclass(frozen=True)
class StreamedTokenFile:
    """One token file of a local export, made as it is written: ``.bin`` from the spill a chunk at a time (each
    chunk's documents ordered, checked against the plan's ids and token counts, and taken a piece at a time),
    ``.ids`` and ``.idx`` from the plan's records a piece at a time. Memory: one chunk, whatever the file's size."""

    index: int
    where: str
    plan: BucketPlan
    chunks: FileChunks
    spill: ShardSpill
    dtype: np.dtype[Any]
    seeded: bool

    @property
    def span(self) -> ShardSpan:
        return self.plan.spans[self.index]

    def body_pieces(self) -> Iterator[bytes]:
        for chunk in self.chunks.of_file(self.index):
            yield from self._chunk_pieces(chunk)

    def _chunk_pieces(self, chunk: int) -> Iterator[bytes]:
        start, samples = self.chunks.starts[chunk], self.chunks.router.samples[chunk]
        rows = self.spill.read(chunk)
        if rows.num_rows != samples:
            raise IntegrityError(f"{self.where}: {rows.num_rows} documents routed to its documents {start - self.span.start}"
                                 f"..{start - self.span.start + samples - 1}, the plan has {samples}; the table version "
                                 "changed underneath? re-run the export")
        ids = rows[KEY_COLUMN].combine_chunks()
        if self.seeded:
            hashes = np.asarray(rows["order_hash"].combine_chunks(), dtype=np.int64).view(np.uint64)
            order = pc.sort_indices(pa.table({"h": hashes, "id": ids}),
                                    sort_keys=[("h", "ascending"), ("id", "ascending")])
            del hashes
        else:
            order = pc.sort_indices(ids)
        documents = rows["tokens"].combine_chunks()
        del rows
        planned = pa.concat_tables([records.select([KEY_COLUMN, "size"])
                                    for records in plan_records(self.plan, start, samples)])
        if not ids.take(order).equals(planned.column(KEY_COLUMN).combine_chunks()):
            raise IntegrityError(f"{self.where}: the documents routed to it are not the plan's; the table version changed "
                                 "underneath? re-run the export")
        del ids
        offsets = np.frombuffer(documents.buffers()[1], dtype=np.int64)[documents.offset:
                                                                        documents.offset + len(documents) + 1]
        nbytes = np.diff(offsets)[np.asarray(order).astype(np.int64)]  # export order
        counted = np.asarray(planned.column("size"), dtype=np.int64)
        if not np.array_equal(nbytes, counted * self.dtype.itemsize):
            raise IntegrityError(f"{self.where}: {int(nbytes.sum()) // self.dtype.itemsize} tokens written in its "
                                 f"documents {start - self.span.start}.., {int(counted.sum())} counted; the tokenizer "
                                 "gave different ids on two passes (a nondeterministic tokenizer?)")
        del planned, counted
        begin = 0
        for end in _piece_ends(nbytes).tolist():
            piece = documents.take(order.slice(begin, end - begin))
            piece_offsets = np.frombuffer(piece.buffers()[1], dtype=np.int64)[piece.offset:piece.offset + len(piece) + 1]
            data = piece.buffers()[2]
            if data is not None and piece_offsets[-1] > piece_offsets[0]:
                yield data.slice(int(piece_offsets[0]), int(piece_offsets[-1] - piece_offsets[0])).to_pybytes()
            begin = end

    def ids_pieces(self) -> Iterator[bytes]:
        for records in plan_records(self.plan, self.span.start, self.span.samples, step=IDS_PIECE):
            yield encode_ids(records.column(KEY_COLUMN))

    def idx_pieces(self) -> Iterator[bytes]:
        def lengths() -> Iterator[np.ndarray]:
            for records in plan_records(self.plan, self.span.start, self.span.samples):
                yield np.asarray(records.column("size"), dtype=np.int64)

        return index_pieces(lengths, count=self.span.samples, dtype=self.dtype)


@dataclass
class OrderedTokenFile:
    """One token file written by an engine task from its documents as they arrive, a batch at a time: ``batches``
    are routed rows of this file, each a contiguous range of its export order and the ranges in order (rows within
    a batch in any order: a Ray write task gets a chunk of several runs' rows, a Spark task sorted batches).
    ``.bin`` is written batch by batch (each batch ordered and taken a piece at a time); the documents' ids and
    token counts go to files in ``scratch`` (the task's local disk), from which ``.ids`` and ``.idx`` are then
    streamed. Memory: one batch, whatever the file's size. Checked as it is written: the batches follow one another
    in export order, and the file's documents and tokens are the plan's (``.bin`` is published first, so a failed
    check publishes no part of the file)."""

    index: int
    where: str
    batches: Iterator[pa.Table]
    samples: int  # documents the plan gives the file
    tokens: int  # tokens counted for it
    dtype: np.dtype[Any]
    seeded: bool
    scratch: str

    @property
    def _ids_path(self) -> str:
        return os.path.join(self.scratch, "ids")

    @property
    def _lengths_path(self) -> str:
        return os.path.join(self.scratch, "lengths.int64")

    def body_pieces(self) -> Iterator[bytes]:
        documents_seen, tokens_seen = 0, 0
        last: tuple[int, str] | None = None  # the export key of the previous batch's last document
        with open(self._ids_path, "wb") as ids_out, open(self._lengths_path, "wb") as lengths_out:
            for rows in self.batches:
                if not rows.num_rows:
                    continue
                if pc.any(pc.not_equal(rows["shard"], self.index)).as_py():
                    raise IntegrityError(f"{self.where}: documents of several token files given to one writer")
                ids = rows[KEY_COLUMN].combine_chunks()
                if self.seeded:
                    hashes = np.asarray(rows["order_hash"].combine_chunks(), dtype=np.int64).view(np.uint64)
                    order = pc.sort_indices(pa.table({"h": hashes, "id": ids}),
                                            sort_keys=[("h", "ascending"), ("id", "ascending")])
                else:
                    hashes = np.zeros(len(ids), dtype=np.uint64)
                    order = pc.sort_indices(ids)
                positions = np.asarray(order).astype(np.int64)
                first = (int(hashes[positions[0]]), ids[int(positions[0])].as_py())
                if last is not None and first <= last:
                    raise IntegrityError(f"{self.where}: its documents came to the writer out of export order (from "
                                         f"document {documents_seen}); re-run the export")
                last = (int(hashes[positions[-1]]), ids[int(positions[-1])].as_py())
                del hashes
                documents = rows["tokens"].combine_chunks()
                del rows
                ids_out.write(encode_ids(ids.take(order)))
                del ids
                offsets = np.frombuffer(documents.buffers()[1], dtype=np.int64)[documents.offset:
                                                                                documents.offset + len(documents) + 1]
                nbytes = np.diff(offsets)[positions]  # export order
                lengths = nbytes // self.dtype.itemsize
                lengths.tofile(lengths_out)
                documents_seen += len(lengths)
                tokens_seen += int(lengths.sum())
                begin = 0
                for end in _piece_ends(nbytes).tolist():
                    piece = documents.take(order.slice(begin, end - begin))
                    piece_offsets = np.frombuffer(piece.buffers()[1], dtype=np.int64)[piece.offset:
                                                                                      piece.offset + len(piece) + 1]
                    data = piece.buffers()[2]
                    if data is not None and piece_offsets[-1] > piece_offsets[0]:
                        yield data.slice(int(piece_offsets[0]), int(piece_offsets[-1] - piece_offsets[0])).to_pybytes()
                    begin = end
                del documents, order
        if documents_seen != self.samples:
            raise IntegrityError(f"{self.where}: {documents_seen} documents routed, the plan has {self.samples}; the "
                                 "table version changed underneath? re-run the export")
        if tokens_seen != self.tokens:
            raise IntegrityError(f"{self.where}: {tokens_seen} tokens written, {self.tokens} counted; the tokenizer "
                                 "gave different ids on two passes (a nondeterministic tokenizer?)")

    def ids_pieces(self) -> Iterator[bytes]:
        with open(self._ids_path, "rb") as source:
            while piece := source.read(PIECE_BYTES):
                yield piece

    def idx_pieces(self) -> Iterator[bytes]:
        def lengths() -> Iterator[np.ndarray]:
            with open(self._lengths_path, "rb") as source:
                while piece := source.read(8 * RECORDS_PIECE):
                    yield np.frombuffer(piece, dtype=np.int64)

        return index_pieces(lengths, count=self.samples, dtype=self.dtype)


@dataclass(frozen=True)
class TokenFileWriter(Sink[TokenFileDone, list[TokenFileDone]]):
    """The token export's sink on the write seam: ``route`` routes documents in reading tasks, ``write`` (an engine
    task) gets the routed documents of one file a batch at a time in export order (a chunk of Ray's runs, Spark's
    sorted batches), publishes ``.bin``/``.idx``/``.ids`` as they come (``OrderedTokenFile``) and returns its
    ``TokenFileDone``; a local export publishes a ``StreamedTokenFile`` (a chunk at a time) through the same
    ``publish``. Picklable (the tokenizer travels as its JSON). No ``abort``: published files stay,
    journalled, for a re-run to keep."""

    release: str
    tokenizer: LoadedTokenizer
    router: ShardRouter
    shuffle_seed: int | None
    starts: tuple[int, ...]
    tokens: tuple[int, ...]
    tier_name: str
    tier_spec: Any
    tier_source: str
    folder: str  # the token folder under the release on the tier
    journal_dir: str | None = None

    def tier(self) -> Tier:
        return Tier(self.tier_name, self.tier_spec, source=self.tier_source)

    def uri(self, target: Tier, index: int, suffix: str = "") -> str:
        return target.uri(self.release, self.folder, file_prefix(self.release, index) + suffix)

    def route(self, staged: pa.RecordBatch | pa.Table, *, only: frozenset[int] | None = None,
              router: ShardRouter | None = None) -> pa.Table:
        """Routed documents of a staged batch (``sample_id``, token bytes): the file each belongs to (or the chunk,
        by the ``router`` of ``FileChunks``)."""
        table = pa.Table.from_batches([staged]) if isinstance(staged, pa.RecordBatch) else staged
        ids = table[KEY_COLUMN].combine_chunks()
        documents = table["tokens"].combine_chunks()
        hashes = order_hash(ids, self.shuffle_seed) if self.shuffle_seed is not None else None
        files = (router or self.router).route(ids, hashes)
        if only is not None:
            keep = np.isin(files, np.fromiter(only, dtype=np.int64, count=len(only)))
            if not keep.all():
                mask = pa.array(keep)
                ids, documents, files = ids.filter(mask), documents.filter(mask), files[keep]
                hashes = hashes[keep] if hashes is not None else None
        bits = hashes.view(np.int64) if hashes is not None else np.zeros(len(ids), dtype=np.int64)
        return pa.table([pa.array(files, pa.int64()), pa.array(bits, pa.int64()), ids, documents], schema=ROUTED)

    def publish(self, built: OrderedTokenFile | StreamedTokenFile, *, tier: Tier | None = None) -> TokenFileDone:
        """Publish ``.bin`` (first: a streamed file's checks against the plan run as it is written, so a failed one
        publishes no part), ``.ids`` and ``.idx``, each atomically, streamed a piece at a time and hashed as it is
        written (sizes checked after), then journal the file. (Ids with a newline were refused by the plan.)"""
        target = tier or self.tier()
        index = built.index
        described: dict[str, tuple[int, str]] = {}
        for suffix, pieces in ((BIN_SUFFIX, built.body_pieces), (IDS_SUFFIX, built.ids_pieces),
                               (IDX_SUFFIX, built.idx_pieces)):
            uri = self.uri(target, index, suffix)
            described[suffix] = target.publish_stream(uri, pieces(), size=None, sha256=None)
            if target.size(uri) != described[suffix][0]:
                raise IntegrityError(f"tier {target.name}: {uri} has the wrong size after writing; check the tier, re-run")
        done = TokenFileDone(index, file_prefix(self.release, index), self.router.samples[index], self.tokens[index],
                             self.starts[index], described[BIN_SUFFIX], described[IDX_SUFFIX], described[IDS_SUFFIX])
        if self.journal_dir is not None:
            target.publish(f"{self.journal_dir}/{index:06d}.json", json.dumps(asdict(done)).encode())
        return done

    def write(self, batches: Iterable[pa.Table]) -> TokenFileDone:
        """An engine task: one file's routed documents, a batch at a time (each batch a contiguous range of the
        file's export order, the ranges in order: ``OrderedTokenFile``), published as they come."""
        stream = iter(batches)
        first = next((batch for batch in stream if batch.num_rows), None)
        if first is None:
            raise IntegrityError(f"release {self.release!r}: a token file writer was given no documents; re-run the export")
        index = int(first["shard"][0].as_py())
        # a locked scratch folder in the temp folder: what a killed task left there goes with the next sweep of it
        # (an export with no spill folder sweeps it first)
        with scratch_dir(TOKENS_PREFIX) as scratch:
            return self.publish(OrderedTokenFile(index, file_prefix(self.release, index), itertools.chain([first], stream),
                                                 self.router.samples[index], self.tokens[index], self.tokenizer.dtype,
                                                 self.shuffle_seed is not None, scratch))

    def commit(self, results: list[TokenFileDone]) -> list[TokenFileDone]:
        return sorted(results, key=lambda done: done.index)


@dataclass(frozen=True)
class RoutedStaged:
    """The write pass over one data file (a task): its staged tokens, routed to their files (picklable)."""

    staging: Staging
    writer: TokenFileWriter
    only: frozenset[int] | None
    router: ShardRouter | None = None  # routes to chunks (a local export), not files

    def __call__(self, file: str) -> Iterator[pa.Table]:
        for batch in self.staging.read(file):
            routed = self.writer.route(batch, only=self.only, router=self.router)
            if routed.num_rows:
                yield routed


# ---- the export ----------------------------------------------------------------------------------------


def export_tokens(lake: Lake, release_name: str, *, tokenizer: str | os.PathLike[str] | LoadedTokenizer,
                  tier: str | Tier, storage: StorageConfig | None = None, **options: Any) -> TokenManifest:
    """Tokenize a release by name (resolved through ``datahub.release.records``); see ``export_table_tokens``."""
    release = get_release(lake, release_name)
    return export_table_tokens(lake, table=release.table, version=int(release.version), release_name=release.name,
                               release_digest=release.digest, tokenizer=tokenizer, tier=tier, storage=storage,
                               **options)


def export_table_tokens(
    lake: Lake,
    *,
    table: str,
    version: int,
    release_name: str,
    tokenizer: str | os.PathLike[str] | LoadedTokenizer,
    tier: str | Tier,
    storage: StorageConfig | None = None,
    file_tokens: int = DEFAULT_FILE_TOKENS,
    shuffle_seed: int | None = None,
    eod_token: str | None = None,
    add_special_tokens: bool = False,
    release_digest: str | None = None,
    progress: Progress | None = None,
    engine: EngineChoice = "local",
    workers: int | None = None,
    verify: bool = False,
    spill_dir: str | None = None,
    bucket_rows: int | None = None,
    chunk_bytes: int | None = None,
) -> TokenManifest:
    """Write ``table`` at Delta ``version`` as Megatron token files on ``tier``; return the token manifest.

    Same table version, tokenizer bytes and settings -> byte-identical files whichever ``engine`` writes them
    ("local": this process; "ray"/"spark" or a started ``Engine``: tasks, ``workers`` at once). Exporting
    again to a tier that holds them checks the files (size; sha256 too with ``verify``) and rewrites damaged
    ones; to another tier it adds that tier's replicas. The plan is made on local disk (``bucket_rows`` documents a
    bucket at most, for tests), so the driver's memory does not grow with the release. A file is written a chunk of
    about ``chunk_bytes`` of its documents at a time (default ``CHUNK_BYTES``), in this process or in a Ray task; on
    Spark an Arrow batch of its sorted rows at a time (the session's ``spark.sql.execution.arrow.maxRecordsPerBatch``,
    10,000 rows, or ``spark.sql.execution.arrow.maxBytesPerBatch``). So a file's size (``file_tokens``) does not set
    the writer's memory.
    """
    import re

    if not re.match(_RELEASE_NAME, release_name):
        raise SpecError(f"release name {release_name!r}: use letters, digits, '.', '_' or '-' (max 128, no '/')")
    if file_tokens < 1:
        raise SpecError(f"--file-tokens must be >= 1, got {file_tokens}")
    if workers is not None and workers < 1:
        raise SpecError(f"--workers must be >= 1, got {workers}")
    if chunk_bytes is not None and chunk_bytes < 1:
        raise SpecError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    loaded = tokenizer if isinstance(tokenizer, LoadedTokenizer) else \
        load_tokenizer(tokenizer, eod_token=eod_token, add_special_tokens=add_special_tokens)
    target = tier if isinstance(tier, Tier) else _tier(tier, storage)
    source = TableSource(lake, table, int(version))
    schema = source.schema()
    if TEXT_COLUMN not in schema.names or KEY_COLUMN not in schema.names:
        raise IntegrityError(f"{source.where}: token export needs the {KEY_COLUMN!r} and {TEXT_COLUMN!r} columns")
    settings: dict[str, Any] = {"table": table, "table_version": int(version), "file_tokens": file_tokens,
                                "shuffle_seed": shuffle_seed, "order": ORDER, "format": FORMAT,
                                "tokenizer": loaded.info.sha256, "eod_id": loaded.info.eod_id,
                                "add_special_tokens": loaded.info.add_special_tokens}
    export_key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    report = progress or (lambda stage, done, total=None: None)
    folder = token_dir(loaded.info.sha256)

    existing = read_lake_token_manifest(lake, release_name, loaded.info.sha256)
    if existing is not None and existing.export.get("key") != export_key:
        raise ReleaseError(f"release {release_name!r} was tokenized with this tokenizer before with other settings "
                           f"({existing.export.get('settings')}); token files are immutable: export under a new release "
                           "name")
    lineage_txn = f"export-tokens/{release_name}/{target.name}/{folder}"
    refuse_other_export(lake, lineage_txn, export_key, release=release_name, tier=target.name)
    journal = f"{target.uri(release_name, folder)}/_partial/{source.journal_key(export_key)}"
    if existing is not None and target.name in existing.tiers:
        intact = _intact(existing, target, folder, verify=verify)
        if len(intact) == len(existing.files):
            return existing  # already exported to this tier: applying twice is a no-op
    sweep_stale(TOKENS_PREFIX, parent=spill_dir)  # what killed token exports left
    running, owned = _engine(engine)
    try:
        with scratch_dir(TOKENS_PREFIX, parent=spill_dir) as scratch:
            staged_on = target if running is not None else Tier("staging", CfsTier(kind="cfs", path=scratch))
            staging = Staging(staged_on.name, staged_on.spec, staged_on.source,
                              f"{journal}/staged" if running is not None else staged_on.uri("staged"))
            files = source.files()
            report("count", 0, len(files))
            # closing: a plan that raises (a null sample_id) ends the count tasks still in flight at once
            with closing(_count(source, loaded, files, staging, running, report, workers=workers)) as counted:
                plan = plan_files(counted, shuffle_seed=shuffle_seed, file_tokens=file_tokens, where=source.where,
                                  directory=os.path.join(scratch, "plan"), bucket_rows=bucket_rows)
            report("count", len(files), len(files))
            writer = TokenFileWriter(release=release_name, tokenizer=loaded, router=plan.router(),
                                     shuffle_seed=shuffle_seed, starts=tuple(s.start for s in plan.spans),
                                     tokens=tuple(plan.shard_member_bytes(s.index) for s in plan.spans),
                                     tier_name=target.name, tier_spec=target.spec, tier_source=target.source,
                                     folder=folder, journal_dir=journal)
            if existing is not None and target.name in existing.tiers:
                done = intact
            else:
                done = _journalled(writer, target, plan)
            report("files", len(done), len(plan.spans))
            finished = {d.index for d in done}
            todo = [s.index for s in plan.spans if s.index not in finished]
            for written in _write(files, staging, writer, plan, todo, running, workers=workers, spill_dir=scratch,
                                  chunk_bytes=chunk_bytes):
                done.append(written)
                report("files", len(done), len(plan.spans))
                checkpoint(f"export-tokens:after_file:{written.index}")
            # still in the scratch folder: lineage and the digest read the plan's sorted records back
            done.sort(key=lambda d: d.index)
            if existing is not None:  # another tier, or repairs: the very same bytes
                if len(existing.files) != len(done):
                    raise IntegrityError(f"release {release_name!r}: re-export made {len(done)} token files, the "
                                         f"manifest has {len(existing.files)}; the table version changed underneath?")
                for old, new in zip(existing.files, done):
                    if (old.prefix, old.bin.sha256, old.idx.sha256, old.ids.sha256) != \
                            (new.prefix, new.bin[1], new.idx[1], new.ids[1]):
                        raise IntegrityError(f"{new.prefix}: re-export differs from the published token file; the "
                                             "table version changed underneath? export under a new release name")
                # the tier is not in the manifest until it is published: a tier apply (or anyone) may delete its
                # files meanwhile; never publish replicas that are gone (three size look-ups per file, as the text
                # export does)
                vanished = [d.prefix for d in done
                            if any(target.size(writer.uri(target, d.index, suffix)) != part[0]
                                   for suffix, part in ((BIN_SUFFIX, d.bin), (IDX_SUFFIX, d.idx),
                                                        (IDS_SUFFIX, d.ids)))]
                if vanished:
                    more = " ..." if len(vanished) > 3 else ""
                    raise IntegrityError(f"release {release_name!r}: token files {vanished[:3]}{more} vanished from "
                                         f"tier {target.name} during the export (a concurrent `datahub tier apply`?); "
                                         "re-run the export")
            _commit_lineage(lake, release_name, target, writer, done, plan, export_key)
            checkpoint("export-tokens:before_manifest")
            replicas = {d.prefix: {**(existing.files[d.index].replicas if existing else {}),
                                   target.name: writer.uri(target, d.index)} for d in done}
            manifest = TokenManifest(
                release=release_name,
                created=(existing.created if existing
                         else datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
                table=table, table_version=int(version),
                release_digest=release_digest or _content_digest(plan.id_chunks(), table, int(version)),
                shuffle_seed=shuffle_seed, tokenizer=loaded.info, dtype=str(loaded.dtype),
                files=tuple(d.record(replicas[d.prefix]) for d in done),
                export={"key": export_key, "settings": settings},
            )
            if existing is not None:
                manifest = replace(manifest, tokenizer=replace(loaded.info, source=existing.tokenizer.source))
            publish_token_manifest(lake, manifest, [target, *_other_tiers(manifest, target, storage)],
                                   between="export-tokens:after_tier_manifest")
            target.delete(f"{target.uri(release_name, folder)}/_partial", recursive=True)
            # not a live writer's temp files
            target.sweep_partials(target.uri(release_name, folder), older_than=STALE_PARTIAL_S)
            return manifest
    finally:
        if owned and running is not None:
            running.stop()


def _tier(name: str, storage: StorageConfig | None) -> Tier:
    if storage is None:
        raise SpecError(f"tier {name!r}: no storage config given; pass --storage storage.yaml")
    return storage.tier(name)


def _engine(engine: EngineChoice) -> tuple[Engine | None, bool]:
    if engine == "local":
        return None, False
    if isinstance(engine, str):
        if engine not in ("ray", "spark"):
            raise SpecError(f"--engine {engine!r}: token export runs on local, ray or spark")
        running = make_engine(EngineSpec(kind=engine))
        running.start()
        return running, True
    if engine.name not in ("ray", "spark"):
        raise SpecError(f"--engine {engine.name!r}: token export runs on local, ray or spark")
    return engine, False


def _staged_counts(read: StageTokens, file: str) -> list[pa.Table]:
    """One data file's count task on Ray: its tokens staged, its small ``(sample_id, tokens)`` tables back."""
    return list(read(file))


def _count(source: TableSource, tokenizer: LoadedTokenizer, files: list[str], staging: Staging,
           engine: Engine | None, report: Progress, *,
           workers: int | None = None) -> Generator[pa.Table, None, None]:
    """The count pass: ``(sample_id, tokens)`` of every live row, from engine tasks (one per data file) or here;
    every data file's tokens are staged on the way."""
    read = StageTokens(source, tokenizer, staging)
    if engine is None:
        for done, file in enumerate(files, 1):
            yield from read(file)
            report("count", done, len(files))
        return
    if engine.name == "ray":
        # Plain tasks, not Ray Data: on a failed task Ray Data's executor cancels the others without waiting and drops
        # their refs, so they went on staging files after the export raised. map_tasks cancels and waits for every
        # task in flight before the error (or a caller that stops) goes on; results come in file order.
        map_tasks = importlib.import_module("datahub.engines.ray.tasks").map_tasks
        for done, counted in enumerate(map_tasks(engine, files, partial(_staged_counts, read), workers=workers), 1):
            yield from counted
            report("count", done, len(files))
        return
    if files:
        with closing(engine.read_files(files, read).iter_batches()) as batches:  # Frame.iter_batches
            for batch in batches:
                yield batch.select([KEY_COLUMN, "tokens"]).cast(COUNTED)


def _write(files: list[str], staging: Staging, writer: TokenFileWriter, plan: BucketPlan, todo: list[int],
           engine: Engine | None, *, workers: int | None, spill_dir: str | None,
           chunk_bytes: int | None = None) -> Iterator[TokenFileDone]:
    """Write the files ``todo`` from the staged tokens, a chunk of a file's export order at a time wherever they are
    written: in this process (spill files group the documents by chunk, ``StreamedTokenFile``), on Ray (sorted runs
    on the workers' disks, a file's task gathers a chunk of them at a time) or on Spark (a file's rows sorted by its
    shuffle, streamed to its task in batches); an engine task writes through ``OrderedTokenFile``."""
    if not todo:
        return
    only = frozenset(todo) if len(todo) < len(writer.starts) else None
    if engine is None or engine.name == "ray":
        chunks = plan_chunks(plan, itemsize=writer.tokenizer.dtype.itemsize, chunk_bytes=chunk_bytes)
        wanted = None if only is None else frozenset(c for index in todo for c in chunks.of_file(index))
        read = RoutedStaged(staging, writer, wanted, chunks.router)
    if engine is None:
        tier = writer.tier()
        with tempfile.TemporaryDirectory(prefix="datahub-tokens-", dir=spill_dir) as directory:
            spill = ShardSpill(directory, ROUTED)
            for file in files:
                for routed in read(file):
                    spill.add(routed)
            spill.flush()
            for index in todo:
                yield writer.publish(StreamedTokenFile(index, file_prefix(writer.release, index), plan, chunks, spill,
                                                       writer.tokenizer.dtype, writer.shuffle_seed is not None),
                                     tier=tier)
        return
    if engine.name == "ray":
        yield from _write_ray(files, read, writer, chunks, todo, engine, workers=workers, spill_dir=spill_dir)
        return
    spark_export = importlib.import_module(f"datahub.engines.{engine.name}.export")
    writer.start()
    yield from writer.commit(spark_export.write_sorted(
        engine, files, read=RoutedStaged(staging, writer, only), key="shard", order=("order_hash", KEY_COLUMN),
        unsigned=("order_hash",), sink=writer, routed_schema=ROUTED, workers=workers))


@dataclass(frozen=True)
class SortedChunkRun:
    """A Ray write pass's read task over one staged data file: its documents routed to their chunks (``FileChunks``)
    and sorted by chunk, then export order, kept as a run on the task's disk (``spill_runs``); what comes back is
    how many of its rows each chunk takes (picklable)."""

    routed: RoutedStaged

    def __call__(self, file: str) -> tuple[pa.Table, pa.Table]:
        parts = list(self.routed(file))
        rows = pa.concat_tables(parts) if parts else ROUTED.empty_table()
        del parts
        chunk = np.asarray(rows["shard"].combine_chunks(), dtype=np.int64)
        hashes = np.asarray(rows["order_hash"].combine_chunks(), dtype=np.int64).view(np.uint64)  # 0 unseeded
        order = pc.sort_indices(pa.table({"c": chunk, "h": hashes, "id": rows[KEY_COLUMN]}),
                                sort_keys=[("c", "ascending"), ("h", "ascending"), ("id", "ascending")])
        del hashes
        sorted_rows = rows.select(RUN_COLUMNS).take(order)
        del rows
        taken, counts = np.unique(chunk, return_counts=True)
        return sorted_rows, pa.table({"chunk": pa.array(taken, pa.int64()), "rows": pa.array(counts, pa.int64())})


RUN_COLUMNS = ["order_hash", KEY_COLUMN, "tokens"]  # a run's rows: ROUTED less the chunk (the writer adds the file)


def _write_ray(files: list[str], read: RoutedStaged, writer: TokenFileWriter, chunks: FileChunks, todo: list[int],
               engine: Engine, *, workers: int | None, spill_dir: str | None) -> Iterator[TokenFileDone]:
    """Ray: tasks route their staged data file's documents to chunks and keep them sorted on their disk (a run); the
    driver writes, per run, the row where each chunk's rows begin to a file on its disk (runs x chunks int64, read a
    file's chunks at a time); a task per file then gathers its chunks one after the other from every run and
    streams them to the writer (``write_pieces``): a task holds about two chunks, not its file."""
    ray_export = importlib.import_module("datahub.engines.ray.export")
    directory = os.path.join(spill_dir or tempfile.gettempdir(), f"runs-{os.getpid()}-{id(writer):x}")
    os.makedirs(directory)
    runs: list[Any] = []
    count = len(chunks.starts)
    bounds = os.path.join(directory, "bounds.int64")
    try:
        with open(bounds, "wb") as out:
            for run, summary in ray_export.spill_runs(engine, files, read=SortedChunkRun(read), directory=directory,
                                                      workers=workers):
                rows = np.zeros(count, dtype=np.int64)
                rows[np.asarray(summary.column("chunk"), dtype=np.int64)] = np.asarray(summary.column("rows"))
                if int(rows.sum()) != run.rows:
                    raise IntegrityError(f"{writer.release}: a read task sent chunk counts of {int(rows.sum())} rows "
                                         f"for a run of {run.rows}; re-run the export")
                np.concatenate([[0], np.cumsum(rows)]).astype(np.int64).tofile(out)
                runs.append(run)
        groups = ((index, _file_pieces(bounds, len(runs), chunks, index, writer.release)) for index in todo)
        writer.start()
        written: list[TokenFileDone] = []
        for done in ray_export.write_pieces(engine, runs, groups, key="shard", sink=writer, workers=workers):
            written.append(done)
            yield done
        writer.commit(written)
    finally:
        ray_export.remove_runs(engine, runs, directory)


def _file_pieces(bounds: str, runs: int, chunks: FileChunks, index: int, release: str) -> list[list[tuple[int, int, int]]]:
    """File ``index``'s chunks as slices of the runs, (run, first row, end row) per chunk, from the bounds file
    (its chunks' columns only); every chunk must get the plan's documents."""
    first, last = chunks.first[index], chunks.first[index + 1]
    if not runs:
        raise IntegrityError(f"{file_prefix(release, index)}: no documents were routed; re-run the export")
    table = np.memmap(bounds, dtype=np.int64, mode="r", shape=(runs, len(chunks.starts) + 1))
    columns = np.array(table[:, first:last + 1])
    del table
    pieces: list[list[tuple[int, int, int]]] = []
    for column, chunk in enumerate(range(first, last)):
        begin, end = columns[:, column], columns[:, column + 1]
        if int((end - begin).sum()) != chunks.router.samples[chunk]:
            raise IntegrityError(f"{file_prefix(release, index)}: {int((end - begin).sum())} documents routed to its "
                                 f"documents {chunks.starts[chunk] - chunks.starts[first]}.., the plan has "
                                 f"{chunks.router.samples[chunk]}; the table version changed underneath? re-run the export")
        pieces.append([(run, int(begin[run]), int(end[run])) for run in np.flatnonzero(end > begin).tolist()])
    return pieces


def _journalled(writer: TokenFileWriter, target: Tier, plan: BucketPlan) -> list[TokenFileDone]:
    """Files a killed run of this export published and journalled, verified at the destination (size, sha256)."""
    done: list[TokenFileDone] = []
    for span in plan.spans:
        try:
            raw = json.loads(target.read(f"{writer.journal_dir}/{span.index:06d}.json"))
        except FileNotFoundError:
            continue
        entry = TokenFileDone(int(raw["index"]), str(raw["prefix"]), int(raw["documents"]), int(raw["tokens"]),
                              int(raw["first_document"]), *((int(raw[p][0]), str(raw[p][1])) for p in ("bin", "idx", "ids")))
        if (entry.documents, entry.first_document) != (span.samples, span.start):
            continue
        if all(target.verify(writer.uri(target, span.index, suffix), size=part[0], sha256=part[1])
               for suffix, part in ((BIN_SUFFIX, entry.bin), (IDX_SUFFIX, entry.idx), (IDS_SUFFIX, entry.ids))):
            done.append(entry)
    return done


def _intact(existing: TokenManifest, target: Tier, folder: str, *, verify: bool) -> list[TokenFileDone]:
    """The published files still whole on ``target`` (size; sha256 too with ``verify``): the rest is rewritten."""
    done = []
    for index, record in enumerate(existing.files):
        whole = True
        for name in ("bin", "idx", "ids"):
            uri, part = target.uri(existing.release, folder, f"{record.prefix}.{name}"), record.part(name)
            whole = whole and (target.verify(uri, size=part.size, sha256=part.sha256) if verify
                               else target.size(uri) == part.size)
        if whole:
            done.append(TokenFileDone.from_record(index, record))
    return done


def _commit_lineage(lake: Lake, release: str, tier: Tier, writer: TokenFileWriter, done: list[TokenFileDone],
                    plan: BucketPlan, export_key: str) -> None:
    """``exported`` events, one per document: ref = {"tokens": PREFIX URI, "tier", "tokenizer": sha256,
    "document": index in the file}; ``params_hash`` is the export key (table version, tokenizer, settings)."""
    def events() -> Iterator[tuple[pa.Array, pa.Array]]:
        for file in done:
            span = plan.spans[file.index]
            head = json.dumps({"tokens": writer.uri(tier, file.index), "tier": tier.name,
                               "tokenizer": writer.tokenizer.info.sha256})[:-1] + ', "document": '
            start = 0
            # a file's ids and refs (~200 B each) never held whole
            for records in plan_records(plan, span.start, span.samples, step=LINEAGE_PIECE):
                piece = records.column(KEY_COLUMN).combine_chunks()
                positions = pa.array(np.arange(start, start + len(piece), dtype=np.int64)).cast(pa.string())
                start += len(piece)
                yield piece, pc.binary_join_element_wise(pa.scalar(head), positions, pa.scalar("}"), "")

    commit_exported(lake, events(), txn=f"export-tokens/{release}/{tier.name}/{writer.folder}", op=TOKENS_OP,
                    params_hash=export_key,
                    metadata={"datahub.export": release, "datahub.tier": tier.name, "datahub.tokenizer": writer.folder})


def _other_tiers(manifest: TokenManifest, target: Tier, storage: StorageConfig | None) -> list[Tier]:
    return [storage.tier(name) for name in manifest.tiers
            if name != target.name and storage is not None and name in storage.tiers]


def publish_token_manifest(lake: Lake, manifest: TokenManifest, tiers: list[Tier], *, between: str) -> None:
    """The manifest into every tier's token folder, then under the lake (what marks the export, or a tier copy,
    done); ``between`` names the crash-test checkpoint between the two."""
    for tier in tiers:
        tier.publish(tier.uri(manifest.release, token_dir(manifest.tokenizer.sha256), TOKEN_MANIFEST_NAME),
                     manifest.to_json())
    checkpoint(between)
    publish_lake_token_manifest(lake, manifest)


def _content_digest(id_chunks: Iterable[pa.Array], table: str, version: int) -> str:
    """Stand-in for a release digest when exporting a bare table version: table, version and ids in order (the
    same bytes however the ids are chunked)."""
    digest = hashlib.sha256(f"{table}@{version}".encode())
    for ids in id_chunks:
        for start in range(0, len(ids), 65_536):
            chunk = ids.slice(start, 65_536).to_pylist()
            if chunk:
                digest.update(("\n" + "\n".join(chunk)).encode())
    return digest.hexdigest()

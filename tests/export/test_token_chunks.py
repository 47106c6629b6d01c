"""A local token export streams each file a chunk of its export order at a time (``FileChunks``): files many chunks
long are the bytes of files written in one chunk, chunks cut as documented and routed exactly, and ``.idx`` made
a piece at a time is ``encode_index``'s bytes."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from datahub.export import tokens
from datahub.export.tokens import CHUNK_DOCUMENT_BYTES, export_table_tokens, plan_chunks, plan_files, plan_records
from datahub.shards.indexed import encode_index, index_pieces
from tests.export.helpers import cfs_storage
from tests.export.test_tokens import expected, make_lake, read_all, train_tokenizer

pytest.importorskip("tokenizers")


@pytest.mark.parametrize("seed", [None, 5])
@pytest.mark.parametrize("file_tokens", [400, 10**6])
def test_files_many_chunks_long_are_the_bytes_of_files_in_one_chunk(tmp_path, monkeypatch, seed, file_tokens) -> None:
    """With chunks of a few documents (CHUNK_BYTES lowered: every file spans many chunks, and documents larger
    than a chunk are chunks of their own) the files, their sizes and sha256s are those written with the default
    chunk (one per file here), and the reference reader reads the tokenizer's output in export order."""
    lake, version = make_lake(tmp_path / "lake", n=150)
    path = train_tokenizer(tmp_path / "tok.json")
    storage = cfs_storage(("whole", tmp_path / "whole"), ("chunked", tmp_path / "chunked"))
    made: list[tokens.FileChunks] = []
    real_plan_chunks = tokens.plan_chunks

    def recorded(*args, **kwargs):
        made.append(real_plan_chunks(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tokens, "plan_chunks", recorded)

    def run(tier: str):
        return export_table_tokens(lake, table="samples", version=version, release_name=f"r-{tier}", tokenizer=path,
                                   tier=tier, storage=storage, file_tokens=file_tokens, shuffle_seed=seed)

    whole = run("whole")
    assert all(len(made[-1].of_file(f)) == 1 for f in range(len(whole.files)))
    monkeypatch.setattr(tokens, "CHUNK_BYTES", 200)
    monkeypatch.setattr(tokens, "PIECE_BYTES", 7)
    chunked = run("chunked")
    assert min(len(made[-1].of_file(f)) for f in range(len(chunked.files))) >= (2 if file_tokens == 400 else 20)
    for one, other in zip(whole.files, chunked.files, strict=True):
        for part in ("bin", "idx", "ids"):
            written = (tmp_path / "chunked" / "r-chunked" / f"tokens-{whole.tokenizer.sha256[:12]}" /
                       f"{other.prefix}.{part}").read_bytes()
            assert (one.part(part).size, one.part(part).sha256) == (other.part(part).size, other.part(part).sha256) \
                == (len(written), hashlib.sha256(written).hexdigest())
    order, docs = expected(lake, version, path, seed)
    ids, read = read_all(chunked, "chunked")
    assert ids == order and read == [docs[i] for i in order]


@pytest.mark.parametrize("seed", [None, 9])
def test_chunks_close_before_the_document_that_overflows_and_route_every_document_to_its_own(tmp_path, seed) -> None:
    """Every file begins a chunk; a chunk closes before the document that would take its routed bytes past the
    limit (a larger document alone); chunks are contiguous; the router sends each document to the chunk holding
    its export rank, across the plan's buckets."""
    rng = np.random.default_rng(4)
    count = 3000
    ids = pa.array([hashlib.sha256(f"{i}".encode()).hexdigest()[: 8 + i % 25] for i in range(count)], pa.string())
    sizes = rng.integers(1, 60, count)
    sizes[rng.choice(count, 20, replace=False)] = 400  # larger than a chunk
    counted = [pa.table({"sample_id": ids.slice(s, 700), "tokens": pa.array(sizes[s:s + 700], pa.int64())})
               for s in range(0, count, 700)]
    plan = plan_files(counted, shuffle_seed=seed, file_tokens=5000, where="test", directory=str(tmp_path / "plan"),
                      bucket_rows=256)
    assert plan.buckets > 4 and len(plan.spans) > 3
    limit, itemsize = 300, 2
    chunks = plan_chunks(plan, itemsize=itemsize, chunk_bytes=limit)
    records = pa.concat_tables(plan_records(plan, 0, plan.num_samples, step=100))
    cost = (np.asarray(records.column("size")) * itemsize + CHUNK_DOCUMENT_BYTES +
            np.array([len(i.encode()) for i in records.column("sample_id").to_pylist()]))
    starts, samples = list(chunks.starts), list(chunks.router.samples)
    assert starts[0] == 0 and [a + n for a, n in zip(starts, samples)] == starts[1:] + [plan.num_samples]
    assert [starts[chunks.first[f]] for f in range(len(plan.spans))] == [s.start for s in plan.spans]
    assert chunks.first[-1] == len(starts)
    file_ends = {s.start + s.samples for s in plan.spans}
    for start, n in zip(starts, samples):
        held = int(cost[start:start + n].sum())
        assert held <= limit or n == 1
        end = start + n
        if end not in file_ends:  # closed before the next document: it did not fit
            assert held + int(cost[end]) > limit
    assert len(starts) > 2 * len(plan.spans)
    hashes = np.asarray(records.column("order_hash"), dtype=np.uint64) if seed is not None else None
    routed = chunks.router.route(records.column("sample_id"), hashes)
    assert routed.tolist() == np.repeat(np.arange(len(starts)), samples).tolist()


def test_index_pieces_are_the_bytes_of_encode_index(monkeypatch) -> None:
    from datahub.shards import indexed

    monkeypatch.setattr(indexed, "INDEX_PIECE", 7)
    rng = np.random.default_rng(2)
    for dtype in (np.uint16, np.int32):
        for count in (0, 1, 50):
            lengths = rng.integers(0, 1000, count)
            cuts = sorted(rng.integers(0, count + 1, 4).tolist())
            pieces = np.split(lengths, cuts)  # some empty
            streamed = b"".join(index_pieces(lambda: iter(pieces), count=count, dtype=dtype))
            assert streamed == encode_index(lengths, dtype=dtype)
    with pytest.raises(Exception, match="sequence lengths given"):
        b"".join(index_pieces(lambda: iter([np.array([1, 2])]), count=3, dtype=np.uint16))


@pytest.mark.parametrize("damage", ["lose a document", "shorten a document"])
def test_a_chunk_that_disagrees_with_the_plan_publishes_no_part_of_its_file(tmp_path, monkeypatch, damage) -> None:
    """A streamed file's chunks are checked against the plan (document ids, tokens per document) while ``.bin`` is
    written, and ``.bin`` is published first: a chunk in the middle of the file that disagrees (a document lost, or
    its tokens not the ones counted) fails the export with no part of that file on the tier."""
    from datahub.errors import IntegrityError
    from datahub.export import spill as spill_module

    lake, version = make_lake(tmp_path / "lake", n=150)
    path = train_tokenizer(tmp_path / "tok.json")
    monkeypatch.setattr(tokens, "CHUNK_BYTES", 300)
    real_read = spill_module.ShardSpill.read

    def damaged_read(self, shard: int) -> pa.Table:
        rows = real_read(self, shard)
        if shard != 3:
            return rows
        if damage == "lose a document":
            return rows.slice(1)
        documents = rows.column("tokens").combine_chunks()
        shorter = pa.array([documents[0].as_py()[:-2], *documents.slice(1).to_pylist()], pa.large_binary())
        return rows.set_column(rows.schema.get_field_index("tokens"), "tokens", shorter)

    monkeypatch.setattr(spill_module.ShardSpill, "read", damaged_read)
    message = "the plan has" if damage == "lose a document" else "counted"
    with pytest.raises(IntegrityError, match=message):
        export_table_tokens(lake, table="samples", version=version, release_name="r", tokenizer=path, tier="cfs",
                            storage=cfs_storage(("cfs", tmp_path / "cfs")), file_tokens=10**6)
    assert not [p for p in (tmp_path / "cfs").rglob("*") if p.is_file() and "r-000000" in p.name]

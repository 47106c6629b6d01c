"""Release freezing in bounded memory: the version's ids scanned in batches, lineage written in sorted chunks, the
same digest and rows as from the ids held whole."""

from __future__ import annotations

import pyarrow as pa
import pytest
import pyarrow.compute as pc
import pyarrow.dataset as ds

from datahub.lake import Lake, external_sort
from datahub.lake.lineage_rows import lineage_rows
from datahub.lake.scan import scan_batches
from datahub.release import freeze as freeze_module
from datahub.release.create import create_release
from datahub.release.digest import release_digest
from datahub.release.freeze import freeze
from tests.release.helpers import add_samples


def _lake(tmp_path, runs: int = 3, per_run: int = 700) -> Lake:
    lake = Lake(tmp_path / "lake")
    for r in range(runs):
        add_samples(lake, [f"document {r}-{i} " + "word " * (i % 7) for i in range(per_run)], f"s3://in/{r}.jsonl",
                    run_id=f"job-00000000000{r}")
    return lake


def test_scan_batches_gives_the_dataset_rows_in_order_and_bounded(tmp_path):
    lake = _lake(tmp_path)
    dataset = lake.dataset("samples", 2)
    expected = dataset.to_table(columns=["sample_id", "source_offset"])
    batches = list(scan_batches(dataset, columns=["sample_id", "source_offset"], batch_rows=256))
    assert max(b.num_rows for b in batches) <= 256
    assert pa.Table.from_batches(batches).equals(expected)
    only = [f.path for f in dataset.get_fragments()][:1]
    assert sum(b.num_rows for b in scan_batches(dataset, columns=["sample_id"], files=only)) == 700  # one run's file


@pytest.mark.parametrize("run_rows", [65_536, 300])
def test_freeze_scanning_the_version_matches_freezing_given_ids(tmp_path, monkeypatch, run_rows):
    monkeypatch.setattr(freeze_module, "LINEAGE_CHUNK_ROWS", 500)  # several lineage chunks and scan batches
    monkeypatch.setattr(external_sort, "RUN_ROWS", run_rows)  # 300: the ids sorted in spilled runs, then merged
    monkeypatch.setattr(external_sort, "READ_ROWS", 128)
    lake = _lake(tmp_path)
    ids = lake.read("samples", version=2, columns=["sample_id"]).column("sample_id")
    scanned = freeze(lake, "scanned", table="samples", version=2, kind="create", qa_status="none")
    given = freeze(lake, "given", table="samples", version=2, kind="create", qa_status="none", sample_ids=ids)
    assert scanned.digest == given.digest == release_digest(ids)
    assert scanned.row_count == given.row_count == len(ids) > 1000
    lineage = lake.read("lineage")
    for name in ("scanned", "given"):
        rows = lineage.filter(pc.and_(pc.equal(lineage.column("ref"), name),
                                      pc.equal(lineage.column("action"), "released")))
        assert sorted(rows.column("sample_id").to_pylist()) == sorted(ids.to_pylist())
        assert rows.column("sample_id").to_pylist() == sorted(rows.column("sample_id").to_pylist())  # sorted chunks
        assert set(rows.column("reason").to_pylist()) == {None}


def test_create_release_freezes_by_scan(tmp_path):
    lake = _lake(tmp_path, runs=2, per_run=300)
    release = create_release(lake, "r1")
    ids = lake.read("samples", columns=["sample_id"]).column("sample_id")
    assert release.row_count == 600 and release.digest == release_digest(ids)


def test_spilled_freeze_keeps_each_ids_first_reason_and_merges_extra_rows_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(freeze_module, "LINEAGE_CHUNK_ROWS", 256)
    monkeypatch.setattr(external_sort, "RUN_ROWS", 200)
    monkeypatch.setattr(external_sort, "READ_ROWS", 64)
    lake = _lake(tmp_path, runs=1, per_run=300)
    distinct = lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist()
    ids = [distinct[(i * 7) % 300] for i in range(1_200)]  # every id 4 times, the repeats in later runs
    reasons = [f"reason {i}" for i in range(len(ids))]
    first: dict[str, str] = {}
    for sample_id, reason in zip(ids, reasons):
        first.setdefault(sample_id, reason)
    extra_ids = sorted(distinct)[::37]
    extra = lineage_rows(pa.array(extra_ids), run_id="x", op="test@1", action="dropped", reason="extra", ref="r")
    release = freeze(lake, "r", table="samples", version=0, kind="create", qa_status="none",
                     sample_ids=pa.array(ids), released_reason=pa.array(reasons), extra_lineage=extra)
    assert release.row_count == 1_200 and release.digest == release_digest(pa.array(ids))
    lineage = lake.read("lineage", filters=pc.field("ref") == "r")
    released = lineage.filter(pc.equal(lineage.column("action"), "released"))
    assert dict(zip(released.column("sample_id").to_pylist(), released.column("reason").to_pylist())) == first
    assert released.num_rows == 300
    assert sorted(lineage.filter(pc.equal(lineage.column("action"), "dropped")).column("sample_id").to_pylist()) \
        == extra_ids
    order = lineage.column("sample_id").to_pylist()  # released and extra rows interleaved in one sorted stream
    assert order == sorted(order)


def test_extra_lineage_as_a_sorted_stream_gives_the_rows_of_the_table_in_the_same_order(tmp_path, monkeypatch):
    monkeypatch.setattr(freeze_module, "LINEAGE_CHUNK_ROWS", 64)  # the extra rows fall into many chunks
    lake = _lake(tmp_path, runs=1, per_run=500)
    distinct = sorted(lake.read("samples", columns=["sample_id"]).column("sample_id").to_pylist())
    # ids below, between, equal to and above the released ones, some twice (their order must be kept)
    extra_ids = ["0" * 8, *distinct[::11], *[i + "x" for i in distinct[5::13]], "z" * 8, *distinct[::29]]
    # shares larger than a chunk (written in pieces): 150 ids between two released ones, 200 above the last
    extra_ids += [f"{distinct[100]}-{i:03d}" for i in range(150)] + [f"{distinct[-1]}-{i:03d}" for i in range(200)]
    extra_ids += [distinct[100]] * 3 + ["z" * 8]
    extra = lineage_rows(pa.array(extra_ids), run_id="x", op="test@1", action="dropped",
                         reason=pa.array([f"drop {i}" for i in range(len(extra_ids))]), ref="r", sort=False)
    as_table = freeze(lake, "table", table="samples", version=0, kind="create", qa_status="none",
                      extra_lineage=extra.set_column(extra.schema.get_field_index("ref"), "ref",
                                                     pa.repeat(pa.scalar("table"), extra.num_rows)))
    ordered = extra.sort_by([("sample_id", "ascending")])  # stable: equal ids keep their order
    ordered = ordered.set_column(ordered.schema.get_field_index("ref"), "ref",
                                 pa.repeat(pa.scalar("stream"), ordered.num_rows))
    taken: list[int] = []

    def stream():
        for batch in ordered.to_batches(max_chunksize=9):  # record batches, read lazily
            taken.append(batch.num_rows)
            yield batch

    as_stream = freeze(lake, "stream", table="samples", version=0, kind="create", qa_status="none",
                       extra_lineage=stream())
    assert sum(taken) == len(extra_ids) and as_table.digest == as_stream.digest
    lineage = lake.read("lineage")

    def rows(name: str) -> list[tuple]:
        mine = lineage.filter(pc.equal(lineage.column("ref"), name))  # released rows and extra rows alike
        return [(r["sample_id"], r["action"], r["reason"]) for r in mine.to_pylist()]

    by_table, by_stream = rows("table"), rows("stream")
    assert by_table == by_stream and len(by_table) == 500 + len(extra_ids)
    assert [r[0] for r in by_table] == sorted(r[0] for r in by_table)
    # as one stable sort of the released rows followed by the extra rows in their given order
    expected = [(i, "released", None) for i in distinct] + [(i, "dropped", f"drop {n}") for n, i in enumerate(extra_ids)]
    assert by_table == sorted(expected, key=lambda r: r[0])

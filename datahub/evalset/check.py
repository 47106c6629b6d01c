"""Contamination of a table version: samples sharing n-grams with the registered eval sets, streamed in batches.

Memory stays bounded whatever the table's size: the eval n-gram index (8-12 bytes per n-gram), one batch of
``sample_id`` and ``text`` at a time, and the ids of the contaminated samples found, or, when the caller streams them
(``hits=``), only a few examples: the ids then go through sorted runs spilled to local disk (``lake.external_sort``).
A chat, preference or trajectory row is matched by its ``text`` and by views of its conversation columns
(``operators.decontam.views``), so an eval item's question and answer inside a chat are caught as in a text sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import SpecError
from datahub.lake.external_sort import SortedRuns
from datahub.evalset.registry import list_evalsets
from datahub.lake.lake import Lake
from datahub.lake.scan import scan_batches
from datahub.lake.tables import not_of_samples
from operators.decontam.evalsets import load_index
from operators.decontam import ngrams
from operators.decontam.ngrams import DEFAULT_NGRAM, NgramIndex
from operators.decontam.views import match_rows, matched_columns

# ~5 MB of text per batch at 5 KB/doc. Matching a batch grows the process ~15x its text (the n-gram arrays: 75 MB for
# 4.8 MB); a batch of chats ~1.1-1.3x that, its conversation views being matched one family at a time
# (operators.decontam.views; tests/operators/decontam/test_views_memory.py)
BATCH_ROWS = 1024
HITS = pa.schema([("sample_id", pa.string()), ("ref", pa.string())])  # a contaminated sample and its first eval item
EXAMPLES = 5  # refs kept when the contaminated ids are streamed (``describe``'s examples)


@dataclass(frozen=True)
class Contamination:
    """What ``contamination`` found: counts per eval set version and the contaminated samples' refs."""

    table: str
    version: int
    rows_checked: int
    evalsets: list[str]  # ``name@version`` of every set checked
    by_evalset: dict[str, int] = field(default_factory=dict)  # ``name@version`` -> contaminated samples
    refs: dict[str, str] = field(default_factory=dict)  # sample_id -> ``evalset@version:item`` of its first match
    ngram: int = DEFAULT_NGRAM
    contaminated: int | None = None  # when ``refs`` holds examples only (the ids were streamed): how many there are
    evalset_digests: dict[str, str] = field(default_factory=dict)  # ``name@version`` -> its items' content digest
    matcher: int | None = None  # ``ngrams.MATCHER_VERSION`` of the code that matched (None: not recorded)

    @property
    def count(self) -> int:
        return len(self.refs) if self.contaminated is None else self.contaminated

    def describe(self, limit: int = 5) -> str:
        sets = ", ".join(f"{name}: {n} sample(s)" for name, n in sorted(self.by_evalset.items()))
        examples = ", ".join(f"{sid} ({ref})" for sid, ref in list(sorted(self.refs.items()))[:limit])
        return f"{self.count} sample(s) of {self.table} v{self.version} overlap eval sets [{sets}]; e.g. {examples}"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "rows_checked": self.rows_checked,
                "evalsets": self.evalsets, "by_evalset": self.by_evalset, "contaminated": self.count,
                "ngram": self.ngram, "evalset_digests": self.evalset_digests, "matcher": self.matcher}


def contamination(lake: Lake, *, table: str = "samples", version: int | None = None, ngram: int = DEFAULT_NGRAM,
                  min_overlap: int = 1, evalsets: Sequence[str] | None = None, batch_rows: int = BATCH_ROWS,
                  progress: Callable[[int], None] | None = None,
                  hits: Callable[[pa.Table], None] | None = None, examples: int = EXAMPLES,
                  rows: Iterable[pa.Table | pa.RecordBatch] | None = None) -> Contamination:
    """Stream ``table`` at ``version`` (default latest) and find samples sharing n-grams with the eval sets.

    ``hits``: the contaminated samples are handed to it instead of being held, as ``HITS`` tables (sample_id, ref of
    its first eval item), in sample_id order, one row per sample; ``refs`` then keeps the first ``examples`` of them
    (by sample_id). ``rows``: check these batches (``sample_id``, ``text`` and the conversation columns; e.g. the rows
    of ``table`` at ``version`` that a ``release redact`` keeps) instead of the whole version, which then only names
    what they are."""
    version = int(lake.table(table).version()) if version is None else version
    names = lake.dataset(table, version).schema.names
    problem = not_of_samples(table, names, reads="the eval-set check reads samples", lake_ref=lake.ref)
    if problem is not None:
        raise SpecError(problem)
    # The sets checked against: those listed before the index is loaded, and those its refs name. Listed too, not
    # only taken from the refs: a set whose items normalize to no n-gram ("?!") adds no ref, yet it was checked
    # (nothing can match it); the gates compared {} with it and refused every try. Listed before the load: a set
    # re-registered in between appears in both versions, and a gate comparing these digests with the registered
    # ones refuses (never lets a set through unchecked).
    wanted = [s for s in list_evalsets(lake) if evalsets is None or s.name in evalsets]
    index = load_index(lake, evalsets, ngram=ngram)
    checked = sorted({ref.split(":", 1)[0] for ref in index.refs})
    digests = {f"{s.name}@{s.version}": s.digest for s in wanted}
    if not set(checked) <= set(digests):  # registered while the index was loaded
        digests.update({key: s.digest for s in list_evalsets(lake) if (key := f"{s.name}@{s.version}") in checked})
    matcher = ngrams.MATCHER_VERSION  # read at call time: what matched, as the gates compare it
    if not len(index):
        return Contamination(table, version, 0, checked, ngram=ngram, contaminated=None if hits is None else 0,
                             evalset_digests=digests, matcher=matcher)
    batches = _batches(rows, batch_rows) if rows is not None else scan_batches(
        lake.dataset(table, version), columns=matched_columns(names), batch_rows=batch_rows)
    if hits is not None:
        with SortedRuns(HITS, "sample_id") as found:  # a sample's first match, as the held dict keeps it
            scanned = _scan(batches, index, min_overlap, progress, found.add)
            return _streamed(Contamination(table, version, scanned, checked, ngram=ngram, evalset_digests=digests,
                                           matcher=matcher), found, hits, examples)
    refs: dict[str, str] = {}
    by_evalset: dict[str, int] = {}

    def held(matched: pa.Table) -> None:
        for sample_id, ref in zip(matched.column("sample_id").to_pylist(), matched.column("ref").to_pylist()):
            if sample_id not in refs:
                refs[sample_id] = ref
                name = ref.split(":", 1)[0]
                by_evalset[name] = by_evalset.get(name, 0) + 1

    scanned = _scan(batches, index, min_overlap, progress, held)
    return Contamination(table, version, scanned, checked, by_evalset, refs, ngram=ngram, evalset_digests=digests,
                         matcher=matcher)


def _batches(rows: Iterable[pa.Table | pa.RecordBatch], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``rows`` (``sample_id``, ``text`` and the conversation columns present: ``views.matched_columns``) as record
    batches of at most ``batch_rows`` rows (the n-gram arrays of a batch are ~10x its text)."""
    for block in rows:
        table = pa.Table.from_batches([block]) if isinstance(block, pa.RecordBatch) else block
        yield from table.select(matched_columns(table.column_names)).to_batches(max_chunksize=batch_rows)


def _scan(batches: Iterable[pa.RecordBatch], index: NgramIndex, min_overlap: int,
          progress: Callable[[int], None] | None, found: Callable[[pa.Table], None]) -> int:
    """The rows of ``batches`` read (``sample_id``, ``text`` and conversation columns, a batch at a time; matched by
    ``views.match_rows``); each batch's contaminated samples to ``found`` (``HITS``, null ids left out)."""
    rows = 0
    # the batches come from scan_batches, not Dataset.scanner(): the matching is slower than decoding, and the
    # scanner's read-ahead queued decoded batches (220 MB of Arrow on 120 MB of text vs 28 MB; lake/scan.py)
    for batch in batches:
        rows += batch.num_rows
        matches = match_rows(index, batch)
        hit = np.flatnonzero(matches.counts >= min_overlap)
        if len(hit):
            ids = batch.column("sample_id").take(pa.array(hit)).cast(pa.string())
            refs = pa.array([index.refs[item] for item in matches.first_item[hit].tolist()], pa.string())
            matched = pa.table([ids, refs], schema=HITS)
            found(matched.filter(pc.is_valid(matched.column("sample_id"))))
        if progress is not None:
            progress(batch.num_rows)
    return rows


def _streamed(checked: Contamination, found: SortedRuns, hits: Callable[[pa.Table], None],
              examples: int) -> Contamination:
    """``checked`` with the counts of the distinct contaminated samples in ``found``, handed to ``hits``."""
    by_evalset: dict[str, int] = {}
    refs: dict[str, str] = {}
    count = 0
    for block in found.merged():
        count += block.num_rows
        names = pc.replace_substring_regex(block.column("ref"), pattern=":.*$", replacement="")
        for entry in pc.value_counts(names).to_pylist():
            by_evalset[entry["values"]] = by_evalset.get(entry["values"], 0) + entry["counts"]
        if len(refs) < examples:
            taken = block.slice(0, examples - len(refs))
            refs.update(zip(taken.column("sample_id").to_pylist(), taken.column("ref").to_pylist()))
        hits(block)
    return Contamination(checked.table, checked.version, checked.rows_checked, checked.evalsets,
                         dict(sorted(by_evalset.items())), refs, ngram=checked.ngram, contaminated=count,
                         evalset_digests=checked.evalset_digests, matcher=checked.matcher)

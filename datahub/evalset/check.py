"""Contamination of a table version: samples sharing n-grams with the registered eval sets, streamed in batches.

Memory stays bounded whatever the table's size: the eval n-gram index (8-12 bytes per n-gram), one batch of
``sample_id`` and ``text`` at a time, and the ids of the contaminated samples found.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from datahub.errors import SpecError
from datahub.lake.lake import Lake
from datahub.lake.tables import not_of_samples
from operators.decontam.evalsets import load_index
from operators.decontam.ngrams import DEFAULT_NGRAM

BATCH_ROWS = 1024  # ~5 MB of text per batch at 5 KB/doc; the n-gram arrays are ~10x the text


@dataclass(frozen=True)
class Contamination:
    """What ``contamination`` found: counts per eval set version and the contaminated samples' refs."""

    table: str
    version: int
    rows_checked: int
    evalsets: list[str]  # ``name@version`` of every set checked
    by_evalset: dict[str, int] = field(default_factory=dict)  # ``name@version`` -> contaminated samples
    refs: dict[str, str] = field(default_factory=dict)  # sample_id -> ``evalset@version:item`` of its first match

    @property
    def count(self) -> int:
        return len(self.refs)

    def describe(self, limit: int = 5) -> str:
        sets = ", ".join(f"{name}: {n} sample(s)" for name, n in sorted(self.by_evalset.items()))
        examples = ", ".join(f"{sid} ({ref})" for sid, ref in list(sorted(self.refs.items()))[:limit])
        return f"{self.count} sample(s) of {self.table} v{self.version} overlap eval sets [{sets}]; e.g. {examples}"

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "rows_checked": self.rows_checked,
                "evalsets": self.evalsets, "by_evalset": self.by_evalset, "contaminated": self.count}


def contamination(lake: Lake, *, table: str = "samples", version: int | None = None, ngram: int = DEFAULT_NGRAM,
                  min_overlap: int = 1, evalsets: Sequence[str] | None = None, batch_rows: int = BATCH_ROWS,
                  progress: Callable[[int], None] | None = None) -> Contamination:
    """Stream ``table`` at ``version`` (default latest) and find samples sharing n-grams with the eval sets."""
    version = int(lake.table(table).version()) if version is None else version
    problem = not_of_samples(table, lake.dataset(table, version).schema.names, reads="the eval-set check reads samples",
                             lake_ref=lake.ref)
    if problem is not None:
        raise SpecError(problem)
    index = load_index(lake, evalsets, ngram=ngram)
    checked = sorted({ref.split(":", 1)[0] for ref in index.refs})
    if not len(index):
        return Contamination(table, version, 0, checked)
    refs: dict[str, str] = {}
    by_evalset: dict[str, int] = {}
    rows = 0
    scanner = lake.dataset(table, version).scanner(columns=["sample_id", "text"], batch_size=batch_rows)
    for batch in scanner.to_batches():
        if not batch.num_rows:
            continue
        rows += batch.num_rows
        matches = index.match(batch.column("text"))
        hits = np.flatnonzero(matches.counts >= min_overlap)
        if len(hits):
            ids = batch.column("sample_id").take(pa.array(hits)).to_pylist()
            for sample_id, item in zip(ids, matches.first_item[hits].tolist()):
                ref = index.refs[item]
                if sample_id is not None and sample_id not in refs:
                    refs[sample_id] = ref
                    name = ref.split(":", 1)[0]
                    by_evalset[name] = by_evalset.get(name, 0) + 1
        if progress is not None:
            progress(batch.num_rows)
    return Contamination(table, version, rows, checked, by_evalset, refs)

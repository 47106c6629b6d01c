"""The ``evalsets`` lake table as decontamination reads it: its schema and the latest version of each set.

``datahub.evalset`` writes it (``datahub evalset add NAME PATH``); it sits in the operator layer so the
``decontaminate`` operator (below the release layer) and the release gate (above it) read one definition.
One row per item per version: adding a set again with other content appends a new version; a version's rows
are never rewritten, so a release's ``evalset@version:item`` references stay resolvable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from datahub.errors import LakeError
from operators.decontam.ngrams import DEFAULT_NGRAM, NgramIndex

if TYPE_CHECKING:
    from datahub.lake.lake import Lake

EVALSETS_TABLE = "evalsets"

EVALSETS = pa.schema(
    [
        ("evalset", pa.string()),  # the set's name, e.g. mmlu
        ("version", pa.int64()),  # 1, 2, ... per name
        ("item_id", pa.string()),  # the record's id field, else its 0-based line number
        ("prompt", pa.string()),
        ("answer", pa.string()),
        ("text", pa.string()),  # what n-grams are taken from: prompt and answer, one newline between
        ("item_hash", pa.string()),  # sample_id-style content hash of text (lineage rows use it)
        ("source_uri", pa.string()),
        ("digest", pa.string()),  # of the whole version: same content, same digest (a re-add is a no-op)
        ("added", pa.timestamp("us", tz="UTC")),
    ]
)


def item_ref(evalset: str, version: int, item_id: str) -> str:
    """The lineage ``ref`` of a contaminated sample: ``evalset@version:item``."""
    return f"{evalset}@{version}:{item_id}"


def latest_items(lake: Lake, names: Sequence[str] | None = None, *,
                 columns: Sequence[str] = ("evalset", "version", "item_id", "text")) -> pa.Table:
    """Rows of the latest version of each registered eval set (or of ``names`` only; an unknown name is an error)."""
    if not lake.exists(EVALSETS_TABLE):
        if names:
            raise LakeError(f"eval set(s) {', '.join(names)} not registered in lake {lake.root}: no {EVALSETS_TABLE!r} "
                            "table yet; register one with: datahub evalset add NAME PATH --lake " + lake.ref)
        return EVALSETS.empty_table().select(list(columns))
    versions = lake.read(EVALSETS_TABLE, columns=["evalset", "version"])
    latest = versions.group_by("evalset").aggregate([("version", "max")])
    known = latest.column("evalset").to_pylist()
    if names:
        missing = [n for n in names if n not in known]
        if missing:
            raise LakeError(f"eval set(s) {', '.join(missing)} not registered in lake {lake.root} (registered: "
                            f"{', '.join(sorted(known)) or 'none'}); add with: datahub evalset add NAME PATH --lake {lake.ref}")
        latest = latest.filter(pc.is_in(latest.column("evalset"), pa.array(list(names), pa.string())))
    pairs = zip(latest.column("evalset").to_pylist(), latest.column("version_max").to_pylist())
    expression = None
    for name, version in sorted(pairs):
        term = (pc.field("evalset") == name) & (pc.field("version") == version)
        expression = term if expression is None else expression | term
    if expression is None:
        return EVALSETS.empty_table().select(list(columns))
    rows = lake.read(EVALSETS_TABLE, columns=list(dict.fromkeys([*columns, "evalset", "version", "item_id"])),
                     filters=expression)
    return rows.sort_by([("evalset", "ascending"), ("version", "ascending"), ("item_id", "ascending")]).select(list(columns))


def load_index(lake: Lake, names: Sequence[str] | None = None, *, ngram: int = DEFAULT_NGRAM) -> NgramIndex:
    """The n-gram index of the latest version of every registered eval set (or of ``names``)."""
    rows = latest_items(lake, names)
    refs = [item_ref(e, v, i) for e, v, i in zip(rows.column("evalset").to_pylist(), rows.column("version").to_pylist(),
                                                  rows.column("item_id").to_pylist())]
    return NgramIndex.build(rows.column("text"), refs, ngram=ngram)

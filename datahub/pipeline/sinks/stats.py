"""The ``sink: stats`` branch: counts per source file and per drop reason, kept in the run record."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from datahub.operator import DROP_REASON


@dataclass
class StatsSink:
    """Counts per source file and per drop reason on one branch, kept in the run record."""

    by_source: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    rows: int = 0
    chars: int = 0

    def consume(self, batches: Iterable[pa.Table]) -> None:
        for batch in batches:
            self.rows += batch.num_rows
            alive = pc.is_null(batch.column(DROP_REASON))
            live = batch.filter(alive)
            self.by_source.update(live.column("source_uri").to_pylist())
            self.by_reason.update(r for r in batch.column(DROP_REASON).to_pylist() if r is not None)
            if live.num_rows:
                self.chars += int(pc.sum(pc.utf8_length(live.column("text"))).as_py() or 0)

    def as_dict(self) -> dict[str, object]:
        return {"rows": self.rows, "live_chars": self.chars, "live_by_source": dict(sorted(self.by_source.items())),
                "dropped_by_reason": dict(sorted(self.by_reason.items()))}

"""The shape every quality filter shares: compute signals, store them, drop by rules."""

from __future__ import annotations

from typing import ClassVar, TypeVar

import numpy as np
import pyarrow as pa

from datahub.operator import BatchOperator, Params, add_quality_signals


class FilterParams(Params):
    drop: bool = True  # False: only annotate the `quality` struct, drop nothing


FP = TypeVar("FP", bound=FilterParams)


class QualityFilter(BatchOperator[FP]):
    """Subclasses return signals and an ordered list of (reason, failing-rows mask).

    A row is dropped with the reason of the first rule it fails; rules are vectorized.
    """

    annotates: ClassVar[bool] = True

    def signals(self, table: pa.Table) -> dict[str, np.ndarray | pa.Array]:  # pragma: no cover - interface
        raise NotImplementedError

    def rules(self, signals: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:  # pragma: no cover
        raise NotImplementedError

    def process(self, table: pa.Table) -> pa.Table:
        signals = self.signals(table)
        numeric = {k: v for k, v in signals.items() if isinstance(v, np.ndarray)}
        arrays = {k: (pa.array(v) if isinstance(v, np.ndarray) else v) for k, v in signals.items()}
        table = add_quality_signals(table, arrays)
        if not self.params.drop:
            return table
        reason = first_failure(self.rules(numeric), table.num_rows)
        return self.mark_dropped(table, pa.array(reason != ""), pa.array(reason, pa.string()))


def first_failure(rules: list[tuple[str, np.ndarray]], num_rows: int) -> np.ndarray:
    """Per row, the name of the first failing rule, or "" when every rule passes."""
    reason = np.full(num_rows, "", dtype=object)
    for name, failing in reversed(rules):  # earlier rules overwrite later ones
        reason = np.where(failing, name, reason)
    return reason

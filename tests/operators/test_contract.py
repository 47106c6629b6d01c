"""The operator contract: registry, params, dependencies, row accounting, lineage events."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from datahub.errors import MissingDependencyError, OperatorError
from datahub.operator import (
    DROP_OP,
    DROP_REASON,
    EVENT_PREFIX,
    BatchOperator,
    Params,
    add_quality_signals,
    apply_batch_operator,
    get_operator,
    register,
)


class ShortParams(Params):
    min_chars: int = 5


@register
class DropShort(BatchOperator):
    name = "test_drop_short"
    version = "2"
    Params = ShortParams
    annotates = True

    def process(self, table):
        length = pc.utf8_length(table.column("text"))
        table = add_quality_signals(table, {"chars": length})
        return self.mark_dropped(table, pc.less(length, self.params.min_chars), "too_short")


def rows(texts):
    return pa.table({"sample_id": [f"id{i}" for i in range(len(texts))], "text": texts})


def test_batch_operator_marks_instead_of_deleting():
    op = DropShort({"min_chars": 4})
    out = apply_batch_operator(op, rows(["hello", "hi", "howdy"]), node="short")
    assert out.num_rows == 3
    assert out.column(DROP_REASON).to_pylist() == [None, "too_short", None]
    assert out.column(DROP_OP).to_pylist() == [None, "test_drop_short@2", None]
    assert out.column(EVENT_PREFIX + "short").to_pylist() == ["annotated"] * 3
    assert out.column("quality").combine_chunks().field("chars").to_pylist() == [5, 2, 5]


def test_dead_rows_bypass_later_operators():
    first = apply_batch_operator(DropShort({"min_chars": 4}), rows(["hello", "hi"]), node="a")
    second = apply_batch_operator(DropShort({"min_chars": 10}), first, node="b")
    by_id = {r["sample_id"]: r for r in second.to_pylist()}
    assert by_id["id1"][DROP_OP] == "test_drop_short@2" and by_id["id1"][DROP_REASON] == "too_short"
    assert by_id["id1"][EVENT_PREFIX + "b"] is None  # never shown to node b
    assert by_id["id0"][DROP_REASON] == "too_short" and by_id["id0"][EVENT_PREFIX + "b"] == "annotated"


def test_operator_that_loses_rows_is_an_error():
    class Loses(BatchOperator):
        name = "test_loses_rows"

        def process(self, table):
            return table.slice(1)

    with pytest.raises(OperatorError, match="returned 1 rows for 2"):
        apply_batch_operator(Loses(), rows(["a", "b"]), node="x")


def test_registry_refuses_duplicates_and_suggests_names():
    with pytest.raises(OperatorError, match="taken by"):
        @register
        class Again(BatchOperator):
            name = "test_drop_short"
    with pytest.raises(OperatorError, match="did you mean 'test_drop_short'"):
        get_operator("test_drop_shrt")


def test_missing_dependency_names_the_pip_command():
    class NeedsIt(BatchOperator):
        name = "test_needs_missing_pkg"
        requires = (("datahub_no_such_module", "no-such-package>=1"),)

    with pytest.raises(MissingDependencyError, match=r"pip install 'no-such-package>=1'"):
        NeedsIt()


def test_params_hash_is_stable_and_param_sensitive():
    assert DropShort({"min_chars": 4}).params_hash == DropShort({"min_chars": 4}).params_hash
    assert DropShort({"min_chars": 4}).params_hash != DropShort({"min_chars": 5}).params_hash
    with pytest.raises(Exception, match="min_charz"):
        DropShort({"min_charz": 4})

"""The ``decontaminate`` operator in a job: contaminated samples dropped with reason and ``evalset@version:item`` ref."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from datahub.engines.arrow import ArrowEngine
from datahub.errors import OperatorError
from datahub.evalset import add_evalset
from datahub.lake import Lake
from datahub.pipeline.run import run_job
from datahub.sample_id import sample_id_of
from tests.evalset.helpers import item_text, write_evalset

CLEAN = [f"Notes on the garden, week {i}: we turned the compost, planted beans and watered the young tomatoes." for i in range(20)]
LEAKED = {
    "verbatim": "Study guide. " + item_text("q1") + " End of the guide.",
    "edited": item_text("q2").upper().replace(" ", "   ").replace(" MOST ", " MANY "),
}


def _job(job_spec, tmp_path, params=None, **extra):
    path = tmp_path / "in.jsonl"
    with open(path, "w") as handle:
        for text in CLEAN + list(LEAKED.values()):
            handle.write(json.dumps({"text": text}) + "\n")
    graph = {"decontam": {"op": "decontaminate", "params": params or {}},
             "samples": {"sink": "samples", "after": ["decontam"]}}
    return job_spec([{"uri": str(path)}], graph, **extra)


@pytest.mark.parametrize("engine", ["arrow", "ray"])
def test_job_drops_contaminated_samples(job_spec, tmp_path, engine, request):
    spec = _job(job_spec, tmp_path)
    lake = Lake(spec.lake.root)
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    runner = ArrowEngine(batch_size=7) if engine == "arrow" else request.getfixturevalue("ray_engine")
    result = run_job(spec, engine=runner)
    assert result.status == "succeeded", result.error
    assert result.counts["dropped"] == {"contaminated": 2}
    assert sorted(lake.read("samples").column("text").to_pylist()) == sorted(CLEAN)
    lineage = lake.read("lineage")
    dropped = lineage.filter(pc.equal(lineage.column("action"), "dropped")).to_pylist()
    refs = {row["sample_id"]: (row["reason"], row["ref"], row["op"]) for row in dropped}
    assert refs == {sample_id_of(LEAKED["verbatim"]): ("contaminated", "bench@1:q1", "decontaminate@2"),
                    sample_id_of(LEAKED["edited"]): ("contaminated", "bench@1:q2", "decontaminate@2")}


def test_min_overlap_and_named_sets(job_spec, tmp_path):
    spec = _job(job_spec, tmp_path, {"min_overlap": 15, "evalsets": ["bench"]})
    lake = Lake(spec.lake.root)
    add_evalset(lake, "bench", write_evalset(tmp_path / "bench.jsonl"))
    result = run_job(spec, engine=ArrowEngine())
    # the verbatim plant shares all 17 of q1's 13-grams (>= 15); the edited one lost the 10 crossing "most" (11 of 21 left: it is word 10 of 33)
    assert result.counts["dropped"] == {"contaminated": 1}


def test_no_registered_evalset_is_an_error_unless_allowed(job_spec, tmp_path):
    with pytest.raises(OperatorError, match="no eval set is registered.*datahub evalset add"):
        run_job(_job(job_spec, tmp_path), engine=ArrowEngine())
    result = run_job(_job(job_spec, tmp_path, {"require_evalsets": False}, lake_root=tmp_path / "other"),
                     engine=ArrowEngine())
    assert result.status == "succeeded" and result.counts.get("dropped", {}) == {}


def test_params_are_validated():
    from datahub.operator import build_operator

    with pytest.raises(Exception, match="ngram"):
        build_operator("decontaminate", {"ngram": 1})
    assert build_operator("decontaminate", {}).params.ngram == 13

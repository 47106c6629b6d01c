"""An eval set whose items normalize to no n-gram (punctuation, symbols) is registered: it adds nothing to the
n-gram index, and the release gates must still pass (nothing can match it), not refuse every try because the check
"was made against other eval sets" than those registered. ``evalset add`` refuses such items now
(``registry.MIN_ITEM_WORDS``); a set an older datahub registered still loads, so the set is written as it wrote it."""

from __future__ import annotations

import pyarrow as pa

from datahub.evalset.registry import _register
from datahub.lake import Lake
from datahub.release import create_release, merge_releases, redact
from datahub.sample_id import sample_id_of
from tests.release.helpers import add_samples
from tests.release.test_merge_evalset_gate import CLEAN, OTHER


def test_a_set_without_ngrams_does_not_refuse_create_redact_or_merge(tmp_path):
    lake = Lake(tmp_path / "lake")
    add_samples(lake, CLEAN, "s3://bucket/a.jsonl", run_id="job-aaaaaaaaaaaa")
    add_samples(lake, OTHER, "s3://b/b.jsonl", table="other", run_id="job-bbbbbbbbbbbb")
    create_release(lake, "o", table="other")
    create_release(lake, "r0")
    items = pa.table({"item_id": ["s1"], "prompt": ["?!"], "answer": ["--"], "text": ["?!\n--"]})
    _register(lake, "symbols", items, tmp_path / "symbols.jsonl")  # as an older registry wrote it

    created = create_release(lake, "r")
    redacted = redact(lake, "r0b", source="r0", sample_ids=[sample_id_of(CLEAN[0])], reason="take-down")
    merged = merge_releases(lake, "m", sources=["r0", "o"])
    for release in (created, redacted, merged):
        assert release.details.get("contamination", {}).get("allowed") is None
    assert {r.name for r in (created, redacted, merged)} == {"r", "r0b", "m"}

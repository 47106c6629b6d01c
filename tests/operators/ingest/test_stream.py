"""Input identity: a file re-read after a storage failure must still be the version that was listed."""

from __future__ import annotations

import os

import pytest

from datahub.config.spec import InputSpec
from datahub.errors import IntegrityError
from datahub.pipeline.inputs import list_input_files
from operators.ingest.stream import ensure_unchanged


def test_ensure_unchanged_accepts_the_listed_version_and_refuses_another(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "one"}\n')
    (listed,) = list_input_files([InputSpec(uri=str(path))])
    identity = {"size": listed.size, "etag": listed.etag, "mtime": listed.mtime}
    ensure_unchanged(listed.uri, {}, **identity)  # same bytes, same mtime: fine
    path.write_text('{"text": "one"}\n{"text": "two"}\n')
    with pytest.raises(IntegrityError, match=r"docs\.jsonl: changed while it was being read"):
        ensure_unchanged(listed.uri, {}, **identity)
    os.remove(path)
    with pytest.raises(IntegrityError, match=r"docs\.jsonl: disappeared while it was being read"):
        ensure_unchanged(listed.uri, {}, **identity)

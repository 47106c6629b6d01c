"""`datahub evalset add --prompt-field`: a benchmark whose question sits in a field of its own is registered with its
question; without the option the item (its label alone) is refused, naming file, line, the fields and the option."""

from __future__ import annotations

import json

from tests.cli.test_evalset_check import datahub


def test_an_item_without_a_known_prompt_field_is_refused_until_the_field_is_named(tmp_path):
    items = tmp_path / "custom.jsonl"
    items.write_text(json.dumps({"id": "c1", "stem": "Which gas do plants absorb from the air?",
                                 "label": "carbon dioxide"}) + "\n")
    lake = str(tmp_path / "lake")
    refused = datahub("evalset", "add", "custom", str(items), "--lake", lake)
    assert refused.returncode == 2, refused.stderr
    assert "custom.jsonl:1: item 'c1' has no prompt" in refused.stderr and "fields found: id, label, stem" in \
        refused.stderr and "--prompt-field FIELD" in refused.stderr
    added = datahub("evalset", "add", "custom", str(items), "--lake", lake, "--prompt-field", "stem", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["items"] == 1

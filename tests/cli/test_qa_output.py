"""`datahub qa` on a lake whose job wrote none of the suite's optional signals (every chat, preference, trajectory
and image demo lake under samples.v1): six `skip ... column 'quality_...' not in table` lines read like six
problems. They are one line now, naming the columns and why they are skipped; --json keeps every entry."""

from __future__ import annotations

import json

from tests.cli.conftest import datahub


def test_optional_expectations_on_absent_signals_are_one_line(small_lake):
    out = datahub("qa", "--lake", str(small_lake), "--no-record")
    assert out.returncode == 0, out.stderr
    skips = [line for line in out.stdout.splitlines() if line.strip().startswith("skip")]
    assert len(skips) == 1, out.stdout
    assert ("skip 6 optional expectations: columns not in this table (signals no operator of its job wrote): "
            "quality_language, quality_language_score, quality_gopher_alpha_words_ratio") in " ".join(skips[0].split())
    as_json = json.loads(datahub("qa", "--lake", str(small_lake), "--no-record", "--json").stdout)
    assert sum(1 for r in as_json["results"][0]["results"] if r.get("skipped")) == 6


def test_qa_help_shows_examples_its_own_parser_accepts():
    from tests.cli.test_help_examples import test_every_command_shows_examples_its_own_parser_accepts as examples

    examples(("qa",))

"""Cron validation: five fields, ranges, names, steps; errors name the field."""

from __future__ import annotations

import pytest

from datahub.config.spec import validate_job_spec
from datahub.errors import SpecError
from datahub.config.cron import validate_cron


@pytest.mark.parametrize("expr", ["0 3 * * *", "*/15 * * * *", "0 0 1,15 * mon-fri", "5 4 * jan-mar 0", "@daily", "0  3 * * 7"])
def test_valid(expr):
    assert validate_cron(expr) == " ".join(expr.split()).lower()


@pytest.mark.parametrize("expr, fragment", [
    ("0 3 * *", "has 4 fields; use 5"),
    ("60 * * * *", "minute must be in 0..59, got 60"),
    ("0 24 * * *", "hour must be in 0..23"),
    ("0 0 0 * *", "day of month must be in 1..31"),
    ("0 0 * 13 *", "month must be in 1..12"),
    ("*/0 * * * *", "step must be at least 1"),
    ("0 0 * * fri-mon", "runs backwards"),
    ("0 0 * * funday", "is not a number or a name"),
    ("every day", "has 2 fields"),
])
def test_invalid(expr, fragment):
    with pytest.raises(ValueError, match=fragment):
        validate_cron(expr)


def test_job_spec_schedule_error_names_file_and_field(tmp_path):
    raw = {"name": "x", "lake": {"root": str(tmp_path)}, "inputs": [{"uri": "a"}], "graph": {"s": {"sink": "samples"}},
           "schedule": "0 25 * * *"}
    with pytest.raises(SpecError, match=r"jobs/x.yaml: schedule: .*hour must be in 0..23"):
        validate_job_spec(raw, source="jobs/x.yaml")
    assert validate_job_spec({**raw, "schedule": "0  3 * * *"}).schedule == "0 3 * * *"

"""The operator graph is checked where it is built (``build_graph``, which ``run_job`` calls before any
work): errors name the file, the node and the fix."""

from __future__ import annotations

import pytest

from datahub.config.spec import load_job_spec
from datahub.errors import SpecError
from datahub.pipeline.graph import build_graph
from tests.config.test_spec import BASE, write


def error_of(tmp_path, text: str, overrides=None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        build_graph(load_job_spec(path, overrides), source=str(path))
    return str(info.value)


def test_bad_param_names_node_and_param(tmp_path):
    message = error_of(tmp_path, BASE.replace("{op: normalize_text}", "{op: normalize_text, params: {max_blank_lines: 99}}"))
    assert "job.yaml: graph.normalize.params.max_blank_lines:" in message
    assert "less than or equal to 10" in message and "99" in message


def test_unknown_operator_suggests_close_name(tmp_path):
    message = error_of(tmp_path, BASE.replace("op: normalize_text", "op: normalise_text"))
    assert "graph.normalize.op" in message and "did you mean 'normalize_text'" in message


def test_cycle_is_reported_with_its_path(tmp_path):
    text = BASE.replace("normalize: {op: normalize_text}", "normalize: {op: normalize_text, after: [other]}\n  other: {op: normalize_text, after: [normalize]}")
    message = error_of(tmp_path, text)
    assert "cycle" in message and "normalize" in message and "other" in message


def test_dangling_edge_and_missing_sink(tmp_path):
    assert "unknown node 'nope'" in error_of(tmp_path, BASE.replace("after: [normalize]", "after: [nope]"))
    no_sink = BASE.replace("  samples: {sink: samples, after: [normalize]}\n", "  stats: {sink: stats, after: [normalize]}\n")
    assert "no `sink: samples` node" in error_of(tmp_path, no_sink)


def test_two_samples_sinks_are_refused_naming_nodes_and_fix(tmp_path):
    """A run commits each table once under its run id: a second samples sink would be lost silently."""
    two = BASE + "  more: {sink: samples, after: [normalize]}\n"
    message = error_of(tmp_path, two)
    assert "job.yaml: graph: 2 `sink: samples` nodes" in message
    assert "graph.samples (table samples)" in message and "graph.more (table samples)" in message
    assert "same table 'samples'" in message and "join the branches" in message
    other_table = BASE + "  more: {sink: samples, table: curated, after: [normalize]}\n"
    message = error_of(tmp_path, other_table)
    assert "graph.more (table curated)" in message and "quarantine and lineage are committed once per run" in message
    stats_branch = BASE + "  stats: {sink: stats, after: [normalize]}\n"
    assert set(load_job_spec(write(tmp_path, stats_branch)).graph) == {"normalize", "samples", "stats"}

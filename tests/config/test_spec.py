"""Job spec validation: errors come before any work and name file, field and fix."""

from __future__ import annotations

import textwrap

import pytest

from datahub.config.spec import load_job_spec
from datahub.errors import SpecError

BASE = """
name: t
lake: {root: /tmp/x}
inputs: [{uri: data/demo/*.jsonl.*}]
graph:
  normalize: {op: normalize_text}
  samples: {sink: samples, after: [normalize]}
"""


def write(tmp_path, text: str):
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text: str, overrides=None) -> str:
    with pytest.raises(SpecError) as info:
        load_job_spec(write(tmp_path, text), overrides)
    return str(info.value)


def test_demo_spec_is_valid():
    spec = load_job_spec("jobs/demo.yaml")
    assert spec.name == "demo"
    assert spec.engine.kind == "ray"
    assert "samples" in spec.graph


def test_unknown_field_names_file_and_path(tmp_path):
    message = error_of(tmp_path, BASE.replace("name: t", "name: t\nengin: {kind: ray}"))
    assert "job.yaml: engin: unknown field" in message


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


def test_node_needs_op_or_sink(tmp_path):
    message = error_of(tmp_path, BASE.replace("{op: normalize_text}", "{op: normalize_text, sink: stats}"))
    assert "graph.normalize" in message and "exactly one of" in message


def test_overrides_and_env_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAHUB_TEST_ROOT", "/tmp/from-env")
    path = write(tmp_path, BASE.replace("root: /tmp/x", "root: '${DATAHUB_TEST_ROOT}'"))
    spec = load_job_spec(path, ["graph.normalize.params.max_blank_lines=3", "engine.kind=spark"])
    assert spec.lake.root == "/tmp/from-env"
    assert spec.graph["normalize"].params == {"max_blank_lines": 3}
    assert spec.engine.kind == "spark"
    monkeypatch.delenv("DATAHUB_TEST_ROOT")
    with pytest.raises(SpecError, match="DATAHUB_TEST_ROOT is not set"):
        load_job_spec(path)


def test_yaml_syntax_error_names_line(tmp_path):
    assert "line" in error_of(tmp_path, "name: t\ngraph: [unclosed\n")


def test_job_hash_ignores_lake_location_but_not_graph(tmp_path):
    path = write(tmp_path, BASE)
    a = load_job_spec(path)
    b = load_job_spec(path, ["lake.root=/elsewhere"])
    c = load_job_spec(path, ["graph.normalize.params.max_blank_lines=2"])
    assert a.job_hash() == b.job_hash() != c.job_hash()


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

"""Job spec validation: errors come before any work and name file, field and fix."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

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
    with pytest.raises(SpecError, match=f"^{re.escape(str(path))}: lake.root: environment variable DATAHUB_TEST_ROOT is not set"):
        load_job_spec(path)


def test_yaml_syntax_error_names_line(tmp_path):
    assert "line" in error_of(tmp_path, "name: t\ngraph: [unclosed\n")


def test_job_hash_ignores_lake_location_but_not_graph(tmp_path):
    path = write(tmp_path, BASE)
    a = load_job_spec(path)
    b = load_job_spec(path, ["lake.root=/elsewhere"])
    c = load_job_spec(path, ["graph.normalize.params.max_blank_lines=2"])
    assert a.job_hash() == b.job_hash() != c.job_hash()


@pytest.mark.parametrize("root", ['""', '"  "', '"${DATAHUB_TEST_UNSET_ROOT:-}"'])
def test_empty_lake_root_is_refused_with_field_and_fix(tmp_path, monkeypatch, root):
    monkeypatch.delenv("DATAHUB_TEST_UNSET_ROOT", raising=False)
    message = error_of(tmp_path, BASE.replace("lake: {root: /tmp/x}", f"lake: {{root: {root}}}"))
    assert "job.yaml: lake.root:" in message and "is empty" in message
    assert "current directory" in message and "lake: {root: /data/lake}" in message and "export" in message


def test_validator_messages_read_as_sentences_with_their_field():
    """Our own validators' ValueErrors: no pydantic 'Value error, ' prefix, no second '(got ...)' when the message
    already shows the value, and no empty field for a check over the whole file."""
    from pydantic import BaseModel, ValidationError, field_validator, model_validator

    from datahub.config.spec import format_validation_error

    class Tier(BaseModel):
        endpoint_url: str

        @field_validator("endpoint_url")
        @classmethod
        def _scheme(cls, value: str) -> str:
            if not value.startswith("http"):
                raise ValueError(f"must start with http:// or https://, got {value!r}")
            return value

    class Config(BaseModel):
        tiers: dict[str, Tier]

        @model_validator(mode="after")
        def _named(self) -> "Config":
            if "hot" not in self.tiers:
                raise ValueError("policy.classes.hot names unknown tiers ['hot']")
            return self

    with pytest.raises(ValidationError) as bad_field:
        Config(tiers={"c": {"endpoint_url": "localhost:7480"}})
    assert format_validation_error("s.yaml", bad_field.value) == \
        "s.yaml: tiers.c.endpoint_url: must start with http:// or https://, got 'localhost:7480'"
    with pytest.raises(ValidationError) as whole:
        Config(tiers={"c": {"endpoint_url": "http://x"}})
    assert format_validation_error("s.yaml", whole.value) == "s.yaml: policy.classes.hot names unknown tiers ['hot']"


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    """YAML keeps the last of two equal keys: a graph node copied and left under the same name vanished silently."""
    text = """\
        name: t
        lake: {root: /tmp/x}
        inputs: [{uri: /tmp/in.jsonl}]
        graph:
          quality: {op: gopher_quality}
          quality: {op: length_filter}
          samples: {sink: samples, after: [quality]}
        """
    message = error_of(tmp_path, text)
    assert message.endswith("job.yaml: line 6, column 3: not valid YAML: duplicate key 'quality' (first at line 5); "
                            "rename or remove one"), message
    merged = "name: t\nbase: &base {root: /tmp/x}\nlake:\n  <<: *base\n  root: /tmp/y\n"  # a merge key overridden: fine
    from datahub.config.yaml_file import read_yaml

    assert read_yaml(write(tmp_path, merged), missing="")["lake"] == {"root": "/tmp/y"}


def test_an_unhashable_key_is_a_yaml_error_with_its_line(tmp_path):
    """`? [a, b]` is a key YAML cannot use in a mapping: a spec error naming the line, not a TypeError traceback."""
    message = error_of(tmp_path, "name: t\n? [a, b]\n: 1\n")
    assert "job.yaml: line 2, column 3: not valid YAML: found unhashable key" in message, message


def test_set_with_a_list_index_past_the_end_is_an_error(tmp_path):
    path = write(tmp_path, BASE)
    for item in ("inputs.5.uri=/tmp/other.jsonl", "inputs.5={uri: /tmp/other.jsonl}"):
        with pytest.raises(SpecError, match=r"job.yaml: --set inputs.5: the list has 1 item\(s\) \(0..0\); an index past its "
                                            r"end cannot be set"):
            load_job_spec(path, [item])
    assert load_job_spec(path, ["inputs.0.uri=/tmp/other.jsonl"]).inputs[0].uri == "/tmp/other.jsonl"


def test_set_with_a_value_that_is_not_yaml_is_an_error(tmp_path):
    with pytest.raises(SpecError, match=r"job.yaml: --set limits: the value '\{' is not valid YAML \(expected the node "
                                        r"content, but found '<stream end>'\)"):
        load_job_spec(write(tmp_path, BASE), ["limits={"])


def test_set_of_a_path_the_spec_does_not_have_names_the_path_the_nearest_keys_and_the_fix(tmp_path):
    """`--set graph.nope.x=1` said `graph.nope.x: unknown field`, as if the file had it: the error now says that the
    --set path names no node / field, which ones are near, and what to do."""
    path = write(tmp_path, BASE)

    def message(item: str) -> str:
        with pytest.raises(SpecError) as info:
            load_job_spec(path, [item])
        return str(info.value)

    text = message("graph.nope.x=1")
    assert text.startswith(f"{path}: --set graph.nope.x=1: the job's graph has no node 'nope'"), text
    assert "its nodes: normalize, samples" in text and "fix the path, or add the node to the job spec" in text, text
    text = message("graph.normalise.params.x=1")
    assert "has no node 'normalise'; did you mean 'normalize'?" in text, text
    text = message("engine.adress=ray://head:10001")
    assert text.startswith(f"{path}: --set engine.adress=ray://head:10001: engine has no field 'adress'; did you mean "
                           "'address'? its fields: kind, address, num_cpus, object_store_mb, master, conf"), text
    text = message("grph.normalize.op=x")
    assert "the job spec has no field 'grph'; did you mean 'graph'?" in text, text
    text = message("graph.normalize.parms.x=1")
    assert "graph.normalize has no field 'parms'; did you mean 'params'?" in text, text
    text = message("inputs.first.uri=/x")
    assert "inputs is a list: give an index (0..0), e.g. --set inputs.0.uri=/x" in text, text
    text = message("name.x=1")
    assert "name is a value (a str), not a mapping: --set name=VALUE" in text, text
    # what exists in the model but not (yet) in the file can be set, as can free-form keys
    spec = load_job_spec(path, ["engine.address=ray://head:10001", "graph.normalize.params.lowercase=true",
                                "lake.storage_options.AWS_REGION=eu", "qa.table=samples"])
    assert spec.engine.address == "ray://head:10001" and spec.lake.storage_options == {"AWS_REGION": "eu"}


def test_malformed_set_items_say_what_form_is_expected(tmp_path):
    path = write(tmp_path, BASE)

    def message(item: str) -> str:
        with pytest.raises(SpecError) as info:
            load_job_spec(path, [item])
        return str(info.value)

    assert message("engine.kind") == (f"{path}: --set 'engine.kind': no '=': expected KEY.PATH=VALUE, e.g. "
                                      "--set engine.kind=VALUE (--set engine.kind= sets an empty string)")
    for item in ("=3", ".=3", " =3"):
        assert message(item) == (f"{path}: --set {item!r}: the key before '=' is empty: expected KEY.PATH=VALUE, "
                                 "e.g. --set graph.dedup.params.threshold=0.9"), item
    assert message("graph..op=x") == (f"{path}: --set 'graph..op=x': the key path has an empty part (two dots, or "
                                      "a dot at an end): expected KEY.PATH=VALUE, e.g. --set graph.dedup.params.threshold=0.9")
    text = message("limits.batch_rows=abc")  # a type mismatch: the model's message, and where the value came from
    assert text == (f"{path}: limits.batch_rows: Input should be a valid integer, unable to parse string as an integer "
                    "(got 'abc'); set by --set limits.batch_rows=abc"), text


def test_set_of_an_operator_param_it_does_not_have_names_its_params_and_the_set_item(tmp_path):
    from datahub.pipeline.graph import build_graph

    path = write(tmp_path, BASE)
    item = "graph.normalize.params.unicode_from=NFKD"
    with pytest.raises(SpecError) as info:
        build_graph(load_job_spec(path, [item]), source=str(path), overrides=[item])
    assert str(info.value) == (f"{path}: graph.normalize.params.unicode_from: unknown field; did you mean "
                               "'unicode_form'? the fields here: unicode_form, collapse_spaces, max_blank_lines, strip; "
                               f"remove it or check the spelling; set by --set {item}")


def test_set_under_a_scalar_of_a_free_form_mapping_is_refused_naming_the_item(tmp_path):
    """`--set graph.normalize.params.a.b=1` where `a: 5` replaced the 5 with {b: 1} silently (bd2d78a; before, an
    error): only an absent or null key becomes a mapping."""
    text = error_of(tmp_path, BASE.replace("{op: normalize_text}", "{op: normalize_text, params: {a: 5}}"),
                    ["graph.normalize.params.a.b=1"])
    assert "--set graph.normalize.params.a.b=1: graph.normalize.params.a is a value (5), not a mapping" in text, text
    assert "--set graph.normalize.params.a=VALUE" in text, text
    with_null = BASE.replace("{op: normalize_text}", "{op: normalize_text, params: {a: null}}")
    spec = load_job_spec(write(tmp_path, with_null), ["graph.normalize.params.a.b=1"])  # null: nothing is replaced
    assert spec.graph["normalize"].params == {"a": {"b": 1}}


def test_set_can_add_a_graph_node_that_it_gives_an_op_or_a_sink(tmp_path):
    """Adding a node with --set worked before bd2d78a (refused since: 'the job's graph has no node'): a new node is
    accepted when the same --set items give it op: or sink:; a path to a node nothing creates is still refused."""
    path = write(tmp_path, BASE)
    spec = load_job_spec(path, ["graph.dedup.after=[normalize]", "graph.dedup.op=exact_dedup",
                                "graph.samples.after=[dedup]"])
    assert spec.graph["dedup"].op == "exact_dedup" and spec.graph["samples"].after == ["dedup"]
    with pytest.raises(SpecError, match="the job's graph has no node 'dedupp'.* to add a node, give it op: or sink:"):
        load_job_spec(path, ["graph.dedupp.params.threshold=0.9"])


def test_set_refuses_a_new_node_named_like_an_existing_one_unless_it_is_placed_with_after(tmp_path):
    """`--set graph.promptS.op=exact_dedup` on jobs/chat-demo.yaml added a node 'promptS' (0421b10; before: "did you
    mean 'prompts'?"), and only build_graph refused it, saying its output goes nowhere. A new node whose name is
    close to an existing node is refused with the suggestion unless the same items give it after: too; the README's
    new-node form on a normalize -> samples job still works."""
    text = error_of(tmp_path, Path("jobs/chat-demo.yaml").read_text(), ["graph.promptS.op=exact_dedup"])
    assert "the job's graph has no node 'promptS'; did you mean 'prompts'?" in text, text
    assert "--set graph.promptS.after=[NODE]" in text, text
    text = error_of(tmp_path, BASE, ["graph.normalise.op=exact_dedup"])
    assert "did you mean 'normalize'?" in text, text
    spec = load_job_spec(write(tmp_path, BASE), ["graph.exact.op=exact_dedup", "graph.exact.after=[normalize]",
                                                 "graph.samples.after=[exact]"])
    assert spec.graph["exact"].after == ["normalize"] and spec.graph["samples"].after == ["exact"]
    spec = load_job_spec(write(tmp_path, BASE), ["graph.normalise.op=exact_dedup", "graph.normalise.after=[normalize]",
                                                 "graph.samples.after=[normalise]"])  # on purpose: placed with after:
    assert spec.graph["normalise"].op == "exact_dedup"

"""Job specs: YAML files validated with pydantic before any work starts.

Errors name the file, the field and the fix, e.g.
``jobs/demo.yaml: graph.dedup.params.threshold: Input should be less than or equal to 1 (got 1.5)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Mapping
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datahub.config.cron import validate_cron
from datahub.config.suites import load_suite
from datahub.close_names import did_you_mean
from datahub.config.yaml_file import read_yaml
from datahub.errors import SpecError
from datahub.kinds.names import KINDS, Kind

INGEST_NODE = "ingest"
_NODE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSpec(_Model):
    kind: Literal["ray", "spark"] = "ray"
    address: str | None = Field(None, description="Ray cluster address; None starts an embedded local Ray")
    num_cpus: int | None = Field(None, ge=1, description="CPUs for an embedded Ray; None = DATAHUB_RAY_NUM_CPUS, else the CPUs this process may use")
    object_store_mb: int | None = Field(
        None, ge=64, description="embedded Ray: cap on its shared-memory object store (MB); beyond it blocks spill "
        "to local disk. None = Ray's default (30% of RAM)")
    master: str | None = Field(None, description="Spark master URL; None = local[2]")
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark conf / Ray init kwargs")


class LakeSpec(_Model):
    root: str = Field(..., description="directory or s3:// URI holding the Delta tables")
    storage_options: dict[str, str] = Field(default_factory=dict, description="delta-rs storage options")

    @field_validator("root")
    @classmethod
    def _root_not_empty(cls, root: str) -> str:
        # An empty root (often `${LAKE_ROOT:-}` with LAKE_ROOT unset) would put the tables in the current directory.
        if not root.strip():
            raise ValueError("is empty: it would write the lake's tables into the current directory; set a directory "
                             "or s3:// URI (e.g. `lake: {root: /data/lake}`), or export the variable it comes from "
                             "(`${LAKE_ROOT:-}` with LAKE_ROOT unset gives an empty root)")
        return root


class InputSpec(_Model):
    uri: str = Field(..., description="a path, glob or URI (local, s3://, hdfs://)")
    format: Literal["auto", "jsonl", "parquet", "text", "warc", "webdataset"] = "auto"
    kind: Kind = Field("text", description="the sample kind this input holds (datahub.kinds): text, image_text, "
                                          "chat, preference or trajectory")
    text_field: str = "text"
    storage_options: dict[str, str] = Field(default_factory=dict)


class LimitsSpec(_Model):
    max_record_bytes: int = Field(1_000_000, ge=1, description="larger records go to quarantine")
    min_text_chars: int = Field(1, ge=1, description="shorter documents go to quarantine as empty")
    batch_rows: int = Field(2048, ge=1, description="rows per Arrow batch inside operators")


class NodeSpec(_Model):
    op: str | None = Field(None, description="registered operator name")
    sink: Literal["samples", "stats"] | None = Field(None, description="where rows leave the graph")
    table: str | None = Field(None, description="for sink=samples: the lake table (default samples)")
    after: list[str] = Field(default_factory=lambda: [INGEST_NODE], min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _op_or_sink(self) -> NodeSpec:
        if (self.op is None) == (self.sink is None):
            raise ValueError("a node needs exactly one of `op:` (an operator) or `sink:` (samples | stats)")
        return self


class OpenLineageSpec(_Model):
    """Where RunEvents go: appended as JSON lines to ``path`` (file) or POSTed to ``url`` (http)."""

    transport: Literal["file", "http"] = "file"
    path: str | None = Field(None, description="transport file: the JSON-lines file events are appended to")
    url: str | None = Field(None, description="transport http: the collector, e.g. http://marquez:5000")
    namespace: str = "datahub"

    @model_validator(mode="after")
    def _target_of_transport(self) -> OpenLineageSpec:
        # Checked here, not at emit time: a run must not start and then silently lose its events.
        if self.transport == "file" and not (self.path or "").strip():
            raise ValueError("openlineage.path is required for transport: file; add `path: lineage/events.jsonl` "
                             "(or use `transport: http` with `url:`)")
        if self.transport == "http" and not (self.url or "").strip():
            raise ValueError("openlineage.url is required for transport: http; add the collector, e.g. "
                             "`url: http://marquez:5000` (/api/v1/lineage is added when the URL has no path)")
        if self.transport == "http" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError(f"openlineage.url {self.url!r}: expected an http:// or https:// URL")
        return self


class QASpec(_Model):
    """Great Expectations suites (schemas/gx/<name>.json) run on the committed table version."""

    suites: list[str] | None = Field(None, min_length=1, description=(
        "None: the table's default suites, as `datahub qa` picks them (samples.v1, plus posttraining.v1 on a table "
        "with chat, preference or trajectory columns: datahub.config.suites.default_suites)"))
    table: str = "samples"

    @field_validator("suites")
    @classmethod
    def _known_suites(cls, suites: list[str] | None) -> list[str] | None:
        for name in suites or []:
            try:
                load_suite(name)
            except SpecError as exc:  # pydantic reports ValueErrors with the field path
                raise ValueError(str(exc)) from None
        return suites


class JobSpec(_Model):
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    lake: LakeSpec
    inputs: list[InputSpec] = Field(..., min_length=1)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    graph: dict[str, NodeSpec] = Field(..., min_length=1)
    schedule: str | None = Field(None, description="cron expression for `datahub schedule render`")
    openlineage: OpenLineageSpec | None = None
    qa: QASpec | None = Field(None, description="QA suites to run after the samples commit (datahub.qa)")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, schedule: str | None) -> str | None:
        return None if schedule is None else validate_cron(schedule)

    @field_validator("graph")
    @classmethod
    def _node_names(cls, graph: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
        for name in graph:
            if name == INGEST_NODE:
                raise ValueError(f"{INGEST_NODE!r} is the implicit source node; give your node another name")
            if not _NODE_NAME.match(name):
                raise ValueError(f"node name {name!r}: use letters, digits, '_' or '-'")
        return graph

    def input_kinds(self) -> list[str]:
        """The sample kinds this job's inputs hold, in ``KINDS`` order."""
        present = {spec.kind for spec in self.inputs}
        return [kind for kind in KINDS if kind in present]

    def job_hash(self) -> str:
        """Hash of what the job computes (engine and lake location excluded)."""
        payload = self.model_dump(mode="json", include={"name", "inputs", "limits", "graph"})
        for spec in payload["inputs"]:  # jobs written before sample kinds keep their hash
            if spec.get("kind") == "text":
                del spec["kind"]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def expand_env(value: Any, environ: Mapping[str, str] | None = None, *, source: str | None = None, field: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in strings (the one place env vars enter specs). An unset
    variable is an error naming ``source`` (the file) and the field that refers to it."""
    env = os.environ if environ is None else environ
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            where = "".join(f"{part}: " for part in (source, field) if part)
            raise SpecError(f"{where}environment variable {name} is not set (referenced as ${{{name}}}); export it or "
                            f"give a default: ${{{name}:-value}}")

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: expand_env(v, env, source=source, field=f"{field}.{k}" if field else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, env, source=source, field=f"{field}.{i}" if field else str(i)) for i, v in enumerate(value)]
    return value


_SET_EXAMPLE = "e.g. --set graph.dedup.params.threshold=0.9"


def apply_overrides(raw: dict[str, Any], overrides: list[str], *, source: str) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (value parsed as YAML) to the raw spec dict. A path must name a field of
    the job spec's models (or a node the graph has, or a key of a free-form mapping such as ``params``), so a typo is
    an error naming the --set item, the nearest keys and the fix, not an "unknown field" the file does not have."""
    for item in overrides:
        if "=" not in item:
            key = item.strip() or "KEY.PATH"
            raise SpecError(f"{source}: --set {item!r}: no '=': expected KEY.PATH=VALUE, e.g. --set {key}=VALUE "
                            f"(--set {key}= sets an empty string)")
        path, _, text = item.partition("=")
        path = path.strip()
        if not path.strip("."):
            raise SpecError(f"{source}: --set {item!r}: the key before '=' is empty: expected KEY.PATH=VALUE, {_SET_EXAMPLE}")
        keys = path.split(".")
        if not all(keys):
            raise SpecError(f"{source}: --set {item!r}: the key path has an empty part (two dots, or a dot at an end): "
                            f"expected KEY.PATH=VALUE, {_SET_EXAMPLE}")
        _check_set_path(raw, keys, item=item, source=source, new_nodes=_new_nodes(overrides),
                        placed_nodes=_new_nodes(overrides, fields=("after",)))
        node: Any = raw
        for depth, key in enumerate(keys):
            if isinstance(node, list) and key.isdigit() and int(key) >= len(node):
                at = ".".join(keys[:depth + 1])
                raise SpecError(f"{source}: --set {at}: the list has {len(node)} item(s)"
                                + (f" (0..{len(node) - 1})" if node else "") + "; an index past its end cannot be set")
            if depth == len(keys) - 1:
                break
            if isinstance(node, list) and key.isdigit():
                node = node[int(key)]
                continue
            if not isinstance(node, dict):
                raise SpecError(f"{source}: --set {path}: {key!r} is not inside a mapping")
            if node.get(key) is None:  # absent or null (``qa:`` with nothing under it)
                node[key] = {}
            elif not isinstance(node[key], (dict, list)):  # a value set in the file: never replaced by a mapping
                at = ".".join(keys[:depth + 1])
                raise SpecError(f"{source}: --set {item}: {at} is a value ({node[key]!r}), not a mapping: set it "
                                f"with --set {at}=VALUE")
            node = node[key]
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as exc:
            raise SpecError(f"{source}: --set {path}: the value {text!r} is not valid YAML "
                            f"({getattr(exc, 'problem', None) or exc}); quote it or fix it, e.g. --set {path}='...'") from None
        if isinstance(node, list) and keys[-1].isdigit():
            node[int(keys[-1])] = value
        elif isinstance(node, dict):
            node[keys[-1]] = value
        else:
            raise SpecError(f"{source}: --set {path}: cannot set a key inside a {type(node).__name__}")
    return raw


def _new_nodes(overrides: list[str], *, fields: tuple[str, ...] = ("op", "sink")) -> set[str]:
    """Graph nodes the --set items give one of ``fields`` (graph.NAME.op=...): by default those they add."""
    paths = [item.partition("=")[0].strip().split(".") for item in overrides if "=" in item]
    return {keys[1] for keys in paths if len(keys) == 3 and keys[0] == "graph" and keys[2] in fields}


def _check_set_path(raw: dict[str, Any], keys: list[str], *, item: str, source: str,
                    new_nodes: Collection[str] = (), placed_nodes: Collection[str] = ()) -> None:
    """Refuse a --set path that the job spec's models have no place for, naming the nearest keys; a graph node
    that is not in the spec is accepted when it is in ``new_nodes`` (the --set items give it op: or sink:), unless
    its name is close to an existing node's (a typo of it) and it is not in ``placed_nodes`` (given after: too)."""
    model: Any = JobSpec
    node: Any = raw
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth]) or "the job spec"
        model = _unwrap_optional(model)
        origin = get_origin(model)
        if isinstance(model, type) and issubclass(model, BaseModel):
            fields = list(model.model_fields)
            if key not in fields:
                raise SpecError(f"{source}: --set {item}: {where} has no field {key!r}{did_you_mean(key, fields) or ';'} "
                                f"its fields: {', '.join(fields)}; fix the path (the fields are in the job spec "
                                "reference of the README)")
            model = model.model_fields[key].annotation
        elif origin is dict:
            value_type = get_args(model)[1]
            if value_type is NodeSpec:  # graph: the nodes the spec has
                names = list(node) if isinstance(node, dict) else []
                close = did_you_mean(key, names)
                if key not in names and key in new_nodes and close and key not in placed_nodes:
                    raise SpecError(f"{source}: --set {item}: the job's graph has no node {key!r}{close} its nodes: "
                                    f"{', '.join(names)}; fix the path, or, to add a node {key!r} on purpose, place "
                                    f"it in the same --set items, e.g. --set graph.{key}.after=[NODE]")
                if key not in names and key not in new_nodes:
                    raise SpecError(f"{source}: --set {item}: the job's graph has no node {key!r}"
                                    f"{did_you_mean(key, names) or ';'} its nodes: {', '.join(names) or 'none'}; fix the "
                                    "path, or add the node to the job spec (a node needs op: or sink:, and after:); "
                                    f"to add a node, give it op: or sink: too, e.g. --set graph.{key}.op=OPERATOR "
                                    f"--set graph.{key}.after=[NODE]")
            else:
                return  # free-form keys (params, storage_options, conf): the operator or the store checks them
            model = value_type
        elif origin is list:
            length = len(node) if isinstance(node, list) else 0
            if not key.isdigit():
                rest = ".".join(keys[depth + 1:])
                indexes = f"0..{length - 1}" if length else "none yet"
                raise SpecError(f"{source}: --set {item}: {where} is a list: give an index ({indexes}), e.g. "
                                f"--set {where}.0{'.' + rest if rest else ''}={item.partition('=')[2] or 'VALUE'}")
            model = get_args(model)[0]
            node = node[int(key)] if isinstance(node, list) and int(key) < len(node) else None
            continue
        elif model is Any:
            return
        else:
            kind = getattr(model, "__name__", None) or "value"
            raise SpecError(f"{source}: --set {item}: {where} is a value (a {kind}), not a mapping: --set {where}=VALUE")
        node = node.get(key) if isinstance(node, dict) else None


def _fields_at(model: Any, loc: list[str]) -> list[str] | None:
    """The field names of the model at ``loc`` inside ``model`` (None where that is not a model)."""
    for key in loc:
        model = _unwrap_optional(model)
        if isinstance(model, type) and issubclass(model, BaseModel) and key in model.model_fields:
            model = model.model_fields[key].annotation
        elif get_origin(model) in (dict, list):
            model = get_args(model)[-1]
        else:
            return None
    model = _unwrap_optional(model)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_optional(annotation: Any) -> Any:
    """``X | None`` -> ``X``; a union of several models or a Literal stays as it is (a value)."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return args[0]
    if get_origin(annotation) in (Union, UnionType, Literal):
        return str
    return annotation


def format_validation_error(source: str, error: ValidationError, *, prefix: str = "",
                            overrides: list[str] | None = None, model: type[BaseModel] | None = None) -> str:
    """One line per error: file, field, what is wrong; ``overrides`` (--set items): a line about a field one of
    them set ends with it, since the file does not hold that value. ``model``: the model validated, so an unknown
    field is answered with the nearest known ones."""
    set_by = {item.partition("=")[0].strip(): item for item in overrides or [] if "=" in item}
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in (prefix.split(".") if prefix else []) + list(item["loc"]))
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            known = _fields_at(model, [str(part) for part in item["loc"][:-1]]) if model is not None else None
            if known:
                name = str(item["loc"][-1])
                msg = (f"unknown field{did_you_mean(name, known) or ';'} the fields here: {', '.join(known)}; remove "
                       "it or check the spelling")
            else:
                msg = "unknown field; remove it or check the spelling"
        elif item["type"] == "missing":
            msg = "required field is missing; add it"
        elif item["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")  # our validators' own sentences
        got = item.get("input")
        quiet = item["type"] in ("missing", "extra_forbidden") or isinstance(got, dict) or repr(got) in msg
        got_text = "" if quiet else f" (got {got!r})"
        origin = next((item for path, item in set_by.items() if loc == path or loc.startswith(path + ".")), None)
        origin_text = f"; set by --set {origin}" if origin else ""
        lines.append(f"{source}: {loc + ': ' if loc else ''}{msg}{got_text}{origin_text}")  # a model-wide check: no field
    return "\n".join(lines)


def load_job_spec(path: str | os.PathLike[str], overrides: list[str] | None = None) -> JobSpec:
    """Read, override, env-expand and validate a job spec (its models; ``datahub.pipeline.job`` also checks
    its graph and operators)."""
    source = os.fspath(path)
    raw = read_yaml(source, missing="job spec not found; check the path (e.g. jobs/demo.yaml)")
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping with name, lake, inputs and graph")
    raw = apply_overrides(raw, overrides or [], source=source)
    return validate_job_spec(expand_env(raw, source=source), source=source, overrides=overrides)


def validate_job_spec(raw: dict[str, Any], *, source: str = "<spec>", overrides: list[str] | None = None) -> JobSpec:
    """The spec's models (fields, types, ranges); the graph is checked where it is built
    (``datahub.pipeline.graph.build_graph``, called by ``run_job`` before any work). ``overrides``: the --set items
    applied to ``raw``, named in the errors about the fields they set."""
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(source, exc, overrides=overrides, model=JobSpec)) from None

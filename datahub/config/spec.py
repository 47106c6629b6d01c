"""Job specs: YAML files validated with pydantic before any work starts.

Errors name the file, the field and the fix, e.g.
``jobs/demo.yaml: graph.dedup.params.threshold: Input should be less than or equal to 1 (got 1.5)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datahub.config.cron import validate_cron
from datahub.config.suites import load_suite
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


def apply_overrides(raw: dict[str, Any], overrides: list[str], *, source: str) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (value parsed as YAML) to the raw spec dict."""
    for item in overrides:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: expected key.path=value, e.g. --set graph.dedup.params.threshold=0.9")
        path, _, text = item.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            raise SpecError(f"--set {item!r}: empty key")
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
            node = node.setdefault(key, {})
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


def format_validation_error(source: str, error: ValidationError, *, prefix: str = "") -> str:
    lines = []
    for item in error.errors():
        loc = ".".join(str(part) for part in (prefix.split(".") if prefix else []) + list(item["loc"]))
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check the spelling"
        elif item["type"] == "missing":
            msg = "required field is missing; add it"
        elif item["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")  # our validators' own sentences
        got = item.get("input")
        quiet = item["type"] in ("missing", "extra_forbidden") or isinstance(got, dict) or repr(got) in msg
        got_text = "" if quiet else f" (got {got!r})"
        lines.append(f"{source}: {loc + ': ' if loc else ''}{msg}{got_text}")  # a model-wide check has no field
    return "\n".join(lines)


def load_job_spec(path: str | os.PathLike[str], overrides: list[str] | None = None) -> JobSpec:
    """Read, override, env-expand and validate a job spec (its models; ``datahub.pipeline.job`` also checks
    its graph and operators)."""
    source = os.fspath(path)
    raw = read_yaml(source, missing="job spec not found; check the path (e.g. jobs/demo.yaml)")
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a job spec is a YAML mapping with name, lake, inputs and graph")
    raw = apply_overrides(raw, overrides or [], source=source)
    return validate_job_spec(expand_env(raw, source=source), source=source)


def validate_job_spec(raw: dict[str, Any], *, source: str = "<spec>") -> JobSpec:
    """The spec's models (fields, types, ranges); the graph is checked where it is built
    (``datahub.pipeline.graph.build_graph``, called by ``run_job`` before any work)."""
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(source, exc)) from None

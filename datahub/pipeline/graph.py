"""The operator graph: a DAG of named nodes built from a job spec's ``graph:`` section.

The implicit source node ``ingest`` feeds the first operators; a node may feed several
branches (kept samples and a stats branch); a node with several upstreams gets their union.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from datahub.config.spec import INGEST_NODE, JobSpec, format_validation_error
from datahub.errors import OperatorError, SpecError
from datahub.operator import BatchOperator, GlobalOperator, Operator, get_operator


@dataclass
class Node:
    name: str
    upstream: list[str]
    operator: Operator | None = None
    sink: str | None = None
    table: str | None = None
    downstream: list[str] = field(default_factory=list)

    @property
    def is_batch(self) -> bool:
        return isinstance(self.operator, BatchOperator)

    @property
    def is_global(self) -> bool:
        return isinstance(self.operator, GlobalOperator)


@dataclass
class Graph:
    nodes: dict[str, Node]  # in topological order
    order: list[str]

    def operators(self) -> list[Node]:
        return [self.nodes[n] for n in self.order if self.nodes[n].operator is not None]

    def sinks(self) -> list[Node]:
        return [self.nodes[n] for n in self.order if self.nodes[n].sink is not None]

    def operator_ids(self) -> list[str]:
        return [node.operator.op_id for node in self.operators() if node.operator is not None]


def _check_kinds(spec: JobSpec, name: str, operator: Operator, source: str) -> None:
    """Every sample kind of the job's inputs flows through every node: the operator must accept each."""
    for index, input_spec in enumerate(spec.inputs):
        if input_spec.kind not in operator.kinds:
            raise SpecError(
                f"{source}: graph.{name}: operator {operator.name!r} does not accept samples of kind "
                f"{input_spec.kind!r} (inputs.{index}: {input_spec.uri}); it accepts: {', '.join(sorted(operator.kinds))}. "
                f"Use an operator made for {input_spec.kind!r}, or put that input in a job of its own"
            )


def build_graph(spec: JobSpec, *, source: str = "<spec>", overrides: list[str] | None = None) -> Graph:
    """The operator graph of ``spec``, checked (operators, params, edges, kinds); ``overrides``: the --set items
    applied to the spec, named in the errors about the params they set."""
    nodes: dict[str, Node] = {}
    for name, node_spec in spec.graph.items():
        operator = None
        if node_spec.op is not None:
            try:
                operator_class = get_operator(node_spec.op)
                operator = operator_class(node_spec.params)
            except OperatorError as exc:
                raise SpecError(f"{source}: graph.{name}.op: {exc}") from None
            except ValidationError as exc:
                raise SpecError(format_validation_error(source, exc, prefix=f"graph.{name}.params",
                                                        overrides=overrides, model=operator_class.Params)) from None
        elif node_spec.params:
            raise SpecError(f"{source}: graph.{name}.params: a sink takes no params; remove them")
        for up in node_spec.after:
            if up != INGEST_NODE and up not in spec.graph:
                raise SpecError(
                    f"{source}: graph.{name}.after: unknown node {up!r}; use {INGEST_NODE!r} or one of: "
                    + ", ".join(sorted(spec.graph))
                )
            if up != INGEST_NODE and spec.graph[up].sink is not None:
                raise SpecError(f"{source}: graph.{name}.after: {up!r} is a sink; sinks end a branch")
        if operator is not None:
            _check_kinds(spec, name, operator, source)
        nodes[name] = Node(name, list(node_spec.after), operator, node_spec.sink, node_spec.table)
    for node in nodes.values():
        for up in node.upstream:
            if up != INGEST_NODE:
                nodes[up].downstream.append(node.name)
    order = _topological_order(nodes, source)
    samples_sinks = [node for node in nodes.values() if node.sink == "samples"]
    if not samples_sinks:
        raise SpecError(f"{source}: graph: no `sink: samples` node; add one, e.g. `samples: {{sink: samples, after: [LAST_NODE]}}`")
    if len(samples_sinks) > 1:
        raise SpecError(_several_samples_sinks(samples_sinks, source))
    for node in nodes.values():
        if node.sink is None and not node.downstream:
            raise SpecError(f"{source}: graph.{node.name}: its output goes nowhere; add a node with `after: [{node.name}]` (e.g. a samples sink)")
    return Graph({n: nodes[n] for n in order}, order)


def _several_samples_sinks(sinks: list[Node], source: str) -> str:
    """Why a graph may hold one samples sink: a run commits each table once under its run id
    (the app transaction), so a second sink's rows, or its quarantine and lineage, would be
    skipped as "already committed", silently."""
    names = ", ".join(f"graph.{node.name} (table {node.table or 'samples'})" for node in sinks)
    tables = [node.table or "samples" for node in sinks]
    clash = sorted({t for t in tables if tables.count(t) > 1})
    what = (f"they write the same table {clash[0]!r}, so all but the first sink's rows would be lost"
            if clash else "quarantine and lineage are committed once per run, so all but the first sink's would be lost")
    return (f"{source}: graph: {len(sinks)} `sink: samples` nodes: {names}; {what}. A job has one samples sink: "
            "join the branches into one node (`after: [a, b]`) before it, make a branch a `sink: stats`, "
            "or split the graph into two jobs")


def _topological_order(nodes: dict[str, Node], source: str) -> list[str]:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    order: list[str] = []

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise SpecError(f"{source}: graph: cycle {' -> '.join(cycle)}; a job graph must be acyclic, remove one `after:` edge")
        state[name] = 1
        for up in nodes[name].upstream:
            if up != INGEST_NODE:
                visit(up, path + [name])
        state[name] = 2
        order.append(name)

    for name in nodes:
        visit(name, [])
    return order

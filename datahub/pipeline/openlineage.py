"""OpenLineage RunEvents (START / COMPLETE / FAIL) for pipeline runs, written without a dependency.

Events follow the OpenLineage 2-0-2 RunEvent schema (https://openlineage.io/spec/2-0-2/OpenLineage.json):
eventType, eventTime, run.runId (a UUID: UUID5 of datahub's run_id, so re-runs of the same
run share it), job.namespace/name, inputs/outputs with namespace/name per the OpenLineage
dataset naming spec (``file`` + path, ``s3://bucket`` + key), producer and schemaURL.
Transports: ``file`` appends one JSON event per line; ``http`` POSTs to ``url`` (the path
``/api/v1/lineage`` is added when the URL has none, as Marquez expects). Emitting never fails
a run: an unreachable collector is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
import uuid
from datetime import datetime, timezone
from typing import Any, Literal
from urllib.parse import urlsplit

from datahub import __version__

log = logging.getLogger(__name__)

SCHEMA_URL = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
ERROR_FACET_URL = "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet"
PRODUCER = f"https://github.com/datahub/datahub/tree/{__version__}"
RUN_NAMESPACE = uuid.UUID("6f1c3a52-5a1e-4d0e-9a49-2d7c1f0b7a11")  # fixed: run UUIDs are stable across hosts

EventType = Literal["START", "COMPLETE", "FAIL"]


def run_uuid(run_id: str) -> str:
    return str(uuid.uuid5(RUN_NAMESPACE, run_id))


def dataset(uri: str) -> dict[str, Any]:
    """An OpenLineage dataset for a path or URI (naming spec: namespace = scheme://authority)."""
    parts = urlsplit(uri)
    if parts.scheme and parts.scheme != "file" and len(parts.scheme) > 1:
        return {"namespace": f"{parts.scheme}://{parts.netloc}", "name": parts.path.lstrip("/") or "/", "facets": {}}
    path = parts.path if parts.scheme == "file" else uri
    return {"namespace": "file", "name": os.path.abspath(path), "facets": {}}


def run_event(
    event_type: EventType,
    *,
    run_id: str,
    job_namespace: str,
    job_name: str,
    inputs: list[str],
    outputs: list[str],
    error: str | None = None,
    event_time: datetime | None = None,
) -> dict[str, Any]:
    facets: dict[str, Any] = {}
    if error is not None:
        facets["errorMessage"] = {"_producer": PRODUCER, "_schemaURL": ERROR_FACET_URL, "message": error,
                                  "programmingLanguage": "python"}
    return {
        "eventType": event_type,
        "eventTime": (event_time or datetime.now(timezone.utc)).isoformat().replace("+00:00", "Z"),
        "run": {"runId": run_uuid(run_id), "facets": facets},
        "job": {"namespace": job_namespace, "name": job_name, "facets": {}},
        "inputs": [dataset(u) for u in inputs],
        "outputs": [dataset(u) for u in outputs],
        "producer": PRODUCER,
        "schemaURL": SCHEMA_URL,
    }


class OpenLineageEmitter:
    """Sends RunEvents to the transport of a job's ``openlineage:`` spec."""

    def __init__(self, *, transport: str, namespace: str, path: str | None = None, url: str | None = None,
                 timeout_s: float = 5.0) -> None:
        self.transport = transport
        self.namespace = namespace
        self.path = path
        self.url = url
        self.timeout_s = timeout_s

    @classmethod
    def from_spec(cls, spec: Any) -> OpenLineageEmitter | None:
        """From ``JobSpec.openlineage`` (None when the job does not configure it)."""
        if spec is None:
            return None
        return cls(transport=spec.transport, namespace=spec.namespace, path=spec.path, url=spec.url)

    def emit(self, event: dict[str, Any]) -> bool:
        """Send one event; returns False (and logs) on failure instead of failing the run."""
        try:
            body = json.dumps(event, sort_keys=True)
            if self.transport == "file":
                if not self.path:
                    raise ValueError("openlineage.path is not set for transport: file")
                directory = os.path.dirname(os.path.abspath(self.path))
                os.makedirs(directory, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.write(body + "\n")
            elif self.transport == "http":
                if not self.url:
                    raise ValueError("openlineage.url is not set for transport: http")
                url = self.url if urlsplit(self.url).path not in ("", "/") else self.url.rstrip("/") + "/api/v1/lineage"
                request = urllib.request.Request(url, data=body.encode(), method="POST",
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - configured URL
                    if response.status >= 300:
                        raise OSError(f"HTTP {response.status}")
            else:
                raise ValueError(f"unknown openlineage transport {self.transport!r}")
            return True
        except Exception as exc:  # noqa: BLE001 - lineage must never break the pipeline
            log.warning("OpenLineage %s event for %s not sent (%s transport): %s",
                        event.get("eventType"), event.get("job", {}).get("name"), self.transport, exc)
            return False

    def run_event(self, event_type: EventType, *, run_id: str, job_name: str, inputs: list[str],
                  outputs: list[str], error: str | None = None) -> bool:
        return self.emit(run_event(event_type, run_id=run_id, job_namespace=self.namespace, job_name=job_name,
                                   inputs=inputs, outputs=outputs, error=error))


def emit_run_event(spec: Any, event_type: EventType, *, run_id: str, inputs: list[str], outputs: list[str],
                   error: str | None = None) -> bool:
    """The one call ``run_job`` makes: a no-op when the job spec has no ``openlineage:`` section."""
    emitter = OpenLineageEmitter.from_spec(getattr(spec, "openlineage", None))
    if emitter is None:
        return False
    return emitter.run_event(event_type, run_id=run_id, job_name=spec.name, inputs=inputs, outputs=outputs, error=error)

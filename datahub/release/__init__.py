"""Versioned dataset releases: frozen, QA-gated, immutable names; channels are movable pointers.

Namespaces (STYLE.md): ``release.create``, ``release.diff``, ``release.merge``,
``release.channels``, ``release.redact``, ``release.vacuum``; this module re-exports the API other code uses.
The export side codes against ``get_release(lake, name).table`` / ``.version``.
"""

from datahub.release.channels import channel_history, channel_of, promote, rollback
from datahub.release.create import create_release
from datahub.release.diff import ReleaseDiff, diff_releases
from datahub.release.digest import release_digest
from datahub.release.merge import merge_releases, parse_weights
from datahub.release.qa_gate import QAVerdict, qa_verdict
from datahub.release.records import Release, get_release, list_releases, read_release
from datahub.release.redact import read_ids_file, redact, redacted_ids, releases_containing
from datahub.release.vacuum import VacuumReport, vacuum

__all__ = [
    "QAVerdict",
    "Release",
    "ReleaseDiff",
    "VacuumReport",
    "channel_history",
    "channel_of",
    "create_release",
    "diff_releases",
    "get_release",
    "list_releases",
    "merge_releases",
    "parse_weights",
    "promote",
    "qa_verdict",
    "read_ids_file",
    "read_release",
    "redact",
    "redacted_ids",
    "release_digest",
    "releases_containing",
    "rollback",
    "vacuum",
]

"""The exceptions of datahub.

Retry decisions depend on the class, never on message text: a ``TransientError`` may
succeed when tried again (storage hiccup, commit conflict), a ``TerminalError`` will not
(bad spec, missing dependency, corrupt data).
"""

from __future__ import annotations


class DatahubError(Exception):
    """Base class of every error datahub raises on purpose."""


class TransientError(DatahubError):
    """A failure that may go away when the same call is retried."""


class TerminalError(DatahubError):
    """A failure that retrying will not fix; the message says what to change."""


class SpecError(TerminalError):
    """A job spec or storage config is invalid. The message names file, field and fix."""


class OperatorError(TerminalError):
    """An operator was misused: unknown name, bad params, missing optional dependency."""


class MissingDependencyError(OperatorError):
    """An optional dependency is not installed; the message carries the pip command."""


class LakeError(TerminalError):
    """The lake is not in the state an operation needs (missing table, schema clash)."""


class EngineUnavailableError(TransientError):
    """The cluster an engine was given (a Ray address, a Spark master) does not answer; it may once it is up."""


class CommitConflictError(TransientError):
    """Another writer committed first; re-reading and retrying the commit can succeed."""


class RunLockedError(TerminalError):
    """Another run of the same job holds the lease on the lake."""


class ReleaseError(TerminalError):
    """A release operation was refused (name taken, QA failed, unknown release)."""


class EvalSetsChangedError(ReleaseError, TransientError):
    """An eval set was registered while a release's rows were checked, so they were not checked against it; nothing
    was written, and the same call again checks against every set registered then (``retry_policy`` retries it)."""


class StorageError(TransientError):
    """A storage tier did not answer as expected; may succeed on retry."""


class IntegrityError(TerminalError):
    """Stored bytes do not match their recorded checksum or size."""

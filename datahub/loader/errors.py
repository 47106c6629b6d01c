"""Errors of the loader; they extend datahub.errors so retry decisions follow the class.

A failed replica read is classified once, here (``replica_error``): ``ReplicaUnavailableError`` is transient
(connection refused or reset, connect or read timeout, HTTP 5xx/408/429: retry the tier later, read the next
one now); ``ReplicaUnusableError`` is terminal for that replica (missing, forbidden, wrong size or sha256:
read the next tier, never retry this one). Anything else a fetch raises is a bug and propagates.
"""

from __future__ import annotations

from datahub.errors import IntegrityError, SpecError, StorageError, TerminalError
from datahub.retry import is_transient_storage_error

# Transport libraries' base classes, matched by name so the loader imports none of them (botocore and aiohttp
# are optional): what they raise and is not transient (no credentials, a bad parameter) is a replica problem.
_TRANSPORT_CLASS_NAMES = {"BotoCoreError", "ClientError", "RequestException", "HTTPError"}


class NoReadableReplicaError(StorageError):
    """Every tier of a shard was tried (with bounded retries) and none gave bytes matching the manifest."""


class ReplicaUnavailableError(StorageError):
    """A tier did not answer a read of a replica (transient): fail over now, try the tier again later."""


class ReplicaUnusableError(IntegrityError):
    """A replica is missing, unreadable or does not match the manifest: retrying this tier will not help."""


class ManifestError(SpecError):
    """A release manifest is missing, unreadable or lacks a field the loader needs."""


class ManifestUnavailableError(StorageError):
    """The store holding a release manifest did not answer (transient), after the loader's bounded retries."""


class ConsumedCountRequiredError(TerminalError):
    """``state_dict()`` was asked for a position this process cannot know (DataLoader workers read the data)."""


def _cause(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def replica_error(error: Exception) -> ReplicaUnavailableError | ReplicaUnusableError | None:
    """The loader's class for an error a replica fetch raised; None for one that is not about storage (a bug)."""
    if isinstance(error, (ReplicaUnavailableError, ReplicaUnusableError)):
        return error
    if is_transient_storage_error(error):
        return ReplicaUnavailableError(_cause(error))
    if isinstance(error, (OSError, ValueError)) or any(
        cls.__name__ in _TRANSPORT_CLASS_NAMES for cls in type(error).__mro__
    ):
        return ReplicaUnusableError(_cause(error))
    return None


class WorkerBatchLostError(TerminalError):
    """A batch a DataLoader worker wrote to its shared-memory ring could not be read back (the worker was killed)."""

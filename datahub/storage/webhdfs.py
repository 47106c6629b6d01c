"""Timeouts for fsspec's WebHDFS client.

fsspec's ``webhdfs`` filesystem sends every request (NameNode calls, the DataNode reads and writes it is
redirected to) through one ``requests.Session`` without a timeout, so a NameNode or DataNode that accepts the
connection and then stops answering blocks the caller forever. ``bound_requests`` gives every request of that
session a (connect, read) timeout unless the call names its own; a timeout then surfaces as an ``OSError``
subclass (``requests.exceptions.Timeout`` is one), which the tier and the loader already turn into a storage
error or a failover.
"""

from __future__ import annotations

from typing import Any


def bound_requests(filesystem: Any, *, connect_timeout_s: float, read_timeout_s: float) -> Any:
    """``filesystem`` (an fsspec ``WebHDFS``), its requests bounded by the two timeouts; other filesystems as
    they are. Returns the filesystem."""
    session = getattr(filesystem, "session", None)
    if session is None or type(filesystem).__name__ != "WebHDFS" or getattr(session, "_datahub_bounded", False):
        return filesystem
    unbounded = session.request
    timeout = (connect_timeout_s, read_timeout_s)

    def request(method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", timeout)
        return unbounded(method, url, **kwargs)

    session.request = request  # Session.get/put/post call self.request: every path of the client is bounded
    session._datahub_bounded = True
    return filesystem

"""What the commands check of the values they are given beyond their types.

An empty value is what a script passes for an unset variable (``--lake "$LAKE"``, ``--out "$OUT"``): read as a
path it is the current directory, so a report was written into the repository a cron job ran in and a lake was
looked for there ("nothing quarantined", exit 0). It is refused, naming the option. A tier endpoint given in a
storage YAML is checked to answer before a command copies to or from it.
"""

from __future__ import annotations

from typing import Any

from datahub.errors import SpecError


def given(value: str | None, option: str, *, what: str) -> str | None:
    """``value`` unless it is empty or blank (then a SpecError naming ``option`` and what it takes); None stays."""
    if value is not None and not value.strip():
        raise SpecError(f"{option} is empty (an unset variable?); give {what}")
    return value


TIER_CONNECT_TIMEOUT_S = 10.0  # a refused port answers at once; a host that drops packets waits this long


def _through_proxy(scheme: str, host: str) -> bool:
    """Whether a request to ``host`` goes through a proxy (``HTTP(S)_PROXY``/``ALL_PROXY``, not bypassed by
    ``NO_PROXY``), as botocore and requests send it."""
    from urllib.request import getproxies, proxy_bypass

    proxies = getproxies()
    return bool(proxies.get(scheme) or proxies.get("all")) and not proxy_bypass(host)


def tier_answers(config: Any, tier: str) -> None:
    """Refuse a ceph or hdfs tier whose endpoint nothing answers on, in seconds and in one line: an export or a tier
    copy otherwise ended in a 180-line botocore/aiohttp traceback ("Could not connect to the endpoint URL"), exit 1,
    after its retries. Only the port is checked (a TCP connect, as engine addresses are); a cfs tier is a path."""
    import socket
    from urllib.parse import urlsplit

    from datahub.errors import StorageError

    spec = config.tiers.get(tier)
    url = getattr(spec, "endpoint_url", None) or getattr(spec, "url", None)
    if spec is None or not isinstance(url, str):  # an unknown tier: the export names the configured ones
        return
    parts = urlsplit(url)
    if _through_proxy(parts.scheme, parts.hostname or ""):  # boto and requests go through it: a direct connect
        return  # would refuse a tier they reach
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, 9870)  # webhdfs: the NameNode's HTTP port
    try:
        with socket.create_connection((parts.hostname, port), timeout=TIER_CONNECT_TIMEOUT_S):
            return
    except socket.gaierror as exc:
        why = f"host {parts.hostname!r} not found ({exc.strerror})"
    except TimeoutError:
        why = f"no answer within {TIER_CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
    service = "the RGW (radosgw)" if spec.kind == "ceph" else "the NameNode (WebHDFS)"
    field = "endpoint_url" if spec.kind == "ceph" else "url"
    raise StorageError(f"{config.source}: tiers.{tier}.{field} {url}: nothing answers ({why}); check the URL and "
                       f"that {service} runs and this machine can reach it")

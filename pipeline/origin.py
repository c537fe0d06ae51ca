"""Which browser pages may open a WebSocket to this server (pure policy, no I/O).

Browsers send an ``Origin`` header on every WebSocket upgrade and cannot forge it; any
web page the user visits may try to connect to ``ws://127.0.0.1:8765`` (cross-site
WebSocket hijacking). The default lets in:

* no ``Origin`` header: not a browser (the Python client, the openai SDK, curl);
* loopback origins, any port: ``http(s)://localhost``, ``127.0.0.1``, ``[::1]``;
* the server's own page: the ``Origin`` names the host and port of the ``Host`` header;
  only when the server is bound to a non-loopback address (bound to loopback, a page
  whose ``Host`` is not loopback reached it through DNS rebinding);
* each origin listed in ``server.allowed_origins``; ``"*"`` lets in every page.

Everything else is refused (HTTP 403 before the upgrade).
"""

from __future__ import annotations

import ipaddress
from typing import Protocol
from urllib.parse import urlsplit

from base.config import ServerConfig

#: The config key that widens the policy (named in refusals and logs).
CONFIG_KEY = "server.allowed_origins"
ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = ("localhost",)


def normalize_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` lower-cased without a default port; None when not an http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in _DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.query or parts.username:
        return None
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" + (f":{port}" if port not in (None, _DEFAULT_PORTS[scheme]) else "")


def is_loopback_host(host: str) -> bool:
    """``localhost`` (and ``*.localhost``) or a loopback IP address; brackets around IPv6 allowed."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_port(host_header: str, scheme: str) -> tuple[str, int] | None:
    """The (host, port) a ``Host`` header names, port defaulted by the origin's scheme."""
    try:
        parts = urlsplit(f"//{host_header.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def origin_allowed(origin: str | None, host_header: str | None, allowed: tuple[str, ...],
                   bind_host: str) -> bool:
    """True when a WebSocket upgrade with this ``Origin`` may proceed (see the module docstring).

    ``host_header`` is the request's ``Host``; ``allowed`` is ``server.allowed_origins``;
    ``bind_host`` is ``server.host``.
    """
    if origin is None:
        return True
    if ANY in allowed:
        return True
    normalized = normalize_origin(origin)
    if normalized is None:  # "null" (file://, sandboxed frames) and other non-http origins
        return False
    if normalized in {normalize_origin(a) for a in allowed}:
        return True
    parts = urlsplit(normalized)
    hostname = parts.hostname or ""
    if is_loopback_host(hostname):
        return True
    if is_loopback_host(bind_host) or host_header is None:
        return False
    scheme = parts.scheme
    return _host_port(host_header, scheme) == (hostname, parts.port or _DEFAULT_PORTS[scheme])


class _Headers(Protocol):
    def get_all(self, key: str) -> list[str]: ...


def refused_origin(headers: _Headers, server: ServerConfig) -> str | None:
    """The ``Origin`` to refuse (as sent, for the log and the 403), or None when the upgrade may go on.

    ``headers`` are the upgrade request's (``websockets.datastructures.Headers``). Several
    ``Origin`` headers are refused; several ``Host`` headers count as none.
    """
    origins = headers.get_all("Origin")
    if not origins:
        return None
    if len(origins) > 1:
        return ", ".join(origins)
    hosts = headers.get_all("Host")
    host = hosts[0] if len(hosts) == 1 else None
    return None if origin_allowed(origins[0], host, server.allowed_origins, server.host) else origins[0]


def exposure_warning(bind_host: str, auth_token: str | None) -> str | None:
    """The start-up warning for a server reachable from the network without a token, else None."""
    if auth_token is not None or is_loopback_host(bind_host):
        return None
    return (f"listening on {bind_host} without server.auth_token: anyone who can reach this "
            "machine on the network can use this server (its models, CPU and GPU); set "
            "server.auth_token or bind server.host to 127.0.0.1")

"""Host and Origin checks in front of the admin routes: against DNS rebinding and cross-site requests.

A web page cannot read a loopback server's answers, unless its own name resolves to ``127.0.0.1`` (DNS
rebinding): the browser then sends the page's name in ``Host``. And any page can make the browser *send*
a form to the server (a cross-site request, carrying an ``Origin`` that is not the server's).
:class:`OriginGuard` (ASGI middleware) answers both, in the error format of every Flywheel API
(:func:`infra.http.error_body`):

* **421** ``host_not_allowed`` (``invalid_request_error``): the ``Host`` header names none of the allowed
  hosts. 421 (Misdirected Request) says "this server does not answer for that name", which is the case.
* **403** ``cross_origin_request`` (``permission_error``): a ``POST``, ``PUT``, ``PATCH`` or ``DELETE``
  that a browser sent from another origin (:meth:`HostPolicy.state_change_allowed`, the rule of Go's
  ``net/http.CrossOriginProtection``): an ``Origin`` on a host named in ``FLYWHEEL_ALLOWED_HOSTS``
  passes; else ``Sec-Fetch-Site`` (which pages cannot set) must say ``same-origin`` or ``none``; a browser
  too old to send it must send an ``Origin`` that is the server's own (the ``Host`` it was sent to).
  ``Origin: null`` alone is refused; Chromium sends it with ``Sec-Fetch-Site: same-origin`` for the
  view's own sign-in form, since the view's answers say ``Referrer-Policy: no-referrer``. A request with
  neither header (curl, the SDKs, other services) is no browser's cross-site request and passes.

The allowed hosts (:meth:`HostPolicy.for_server`): the loopback names (``localhost``, any
``127.0.0.0/8`` address, ``[::1]``), the host the server is bound to, the address the connection
actually reached (an IP literal under a real server, so never an attacker's name), and the names in
``FLYWHEEL_ALLOWED_HOSTS`` (comma-separated; ``*`` allows any). A server bound beyond loopback
(``0.0.0.0``: docker compose, Kubernetes) with ``FLYWHEEL_ALLOWED_HOSTS`` unset allows any ``Host``:
services reach it under names it cannot know (``gateway``, ``gateway.flywheel.svc``), rebinding aims at
servers that trust being on loopback, and such a server already needs a strong admin token
(:func:`infra.settings.exposure_problem`). A loopback server always checks. The port is not compared
(a rebinding page names its own host, not another port). A request without ``Host`` (HTTP/1.0) passes.

Only paths under ``prefixes`` are checked: the gateway checks ``/admin`` and ``/ui`` and leaves the LLM
calls (``/v1/...``, ``/episodes/...``) alone, since agents reach it under any name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from infra.http import error_body
from infra.settings import is_loopback

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def split_host(value: str) -> tuple[str, str]:
    """``"Example.com:8100"`` → ``("example.com", "8100")``; ``"[::1]:80"`` → ``("::1", "80")``; no port: ``""``."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    host, colon, port = value.rpartition(":")
    if colon and port.isdigit() and ":" not in host:
        return host.rstrip("."), port
    return value.rstrip("."), ""


def parse_allowed_hosts(value: str) -> tuple[str, ...]:
    """``FLYWHEEL_ALLOWED_HOSTS``: comma-separated host names (ports and brackets ignored), or ``*``."""
    names = (part.strip() for part in value.split(","))
    return tuple("*" if name == "*" else split_host(name)[0] for name in names if name)


@dataclass(frozen=True)
class HostPolicy:
    """Which ``Host`` names a server answers for, and which ``Origin`` hosts may change its state."""

    names: frozenset[str]  # lowercase host names, without port or brackets
    any_host: bool = False
    origins: frozenset[str] = frozenset()  # named in FLYWHEEL_ALLOWED_HOSTS: trusted as Origin too

    @classmethod
    def for_server(cls, bound_host: str, allowed_hosts: str | Iterable[str] = "") -> HostPolicy:
        """The policy of a server listening on ``bound_host`` with ``FLYWHEEL_ALLOWED_HOSTS`` = ``allowed_hosts``."""
        named = (
            parse_allowed_hosts(allowed_hosts)
            if isinstance(allowed_hosts, str)
            else tuple(split_host(h)[0] for h in allowed_hosts)
        )
        bound = bound_host.strip().strip("[]").lower()
        any_host = "*" in named or (not named and not is_loopback(bound))
        explicit = frozenset(n for n in named if n != "*")
        return cls(names=explicit | {bound, "localhost"}, any_host=any_host, origins=explicit)

    def host_allowed(self, host: str, reached: str | None = None) -> bool:
        """``host`` (a ``Host`` header's name) for a connection that reached the address ``reached``."""
        if self.any_host or host in self.names or is_loopback(host):
            return True
        return reached is not None and host == reached.lower()

    def state_change_allowed(self, origin: str | None, fetch_site: str | None, host_header: str) -> bool:
        """Whether a state-changing request with these ``Origin`` and ``Sec-Fetch-Site`` headers (None:
        absent) sent to ``host_header`` comes from the server's own pages (module docstring)."""
        if origin is not None and self.trusted_origin(origin):
            return True
        if fetch_site is not None:
            return fetch_site.strip().lower() in ("same-origin", "none")
        return origin is None or self.origin_allowed(origin, host_header)

    def trusted_origin(self, origin: str) -> bool:
        """``origin`` is on a host named in ``FLYWHEEL_ALLOWED_HOSTS`` (a front end of its own)."""
        try:
            host = urlsplit(origin.strip().lower()).hostname
        except ValueError:
            return False
        return host is not None and host in self.origins

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """``origin`` (an ``Origin`` header) is the server's own (``host_header``'s) or an allowed host."""
        try:
            parts = urlsplit(origin.strip().lower())
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            return False  # "null" and anything else that is no web origin
        origin_port = "" if port is None or str(port) == _DEFAULT_PORTS[parts.scheme] else str(port)
        host, host_port = split_host(host_header)
        if host_port in _DEFAULT_PORTS.values():
            host_port = ""
        if (parts.hostname, origin_port) == (host, host_port):
            return True
        return parts.hostname in self.origins


class OriginGuard:
    """ASGI middleware: :class:`HostPolicy`'s checks on the requests whose path starts with one of
    ``prefixes`` (``("/",)``: all), 421 / 403 in the JSON error format otherwise (module docstring)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, prefixes: tuple[str, ...] = ("/",)) -> None:
        self.app = app
        self.policy = policy
        self.prefixes = prefixes

    def _guarded(self, path: str) -> bool:
        return any(
            path == p.rstrip("/") or path.startswith(p if p.endswith("/") else p + "/") for p in self.prefixes
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host_header = headers.get("host", "")
        server = scope.get("server")
        reached = str(server[0]) if server else None
        if host_header and not self.policy.host_allowed(split_host(host_header)[0], reached):
            await _refuse(
                send,
                421,
                "this server does not answer for that Host",
                "invalid_request_error",
                "host_not_allowed",
            )
            return
        if scope["method"] in STATE_CHANGING and not self.policy.state_change_allowed(
            headers.get("origin"), headers.get("sec-fetch-site"), host_header
        ):
            await _refuse(
                send, 403, "cross-origin request refused", "permission_error", "cross_origin_request"
            )
            return
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, message: str, error_type: str, code: str) -> None:
    body = json.dumps(error_body(message, error_type, code=code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})

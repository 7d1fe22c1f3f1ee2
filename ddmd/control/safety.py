"""Browser safety for the control API: Host and Origin checks, and the optional token.

Layer: imports config (ControlConfig, is_loopback_host) and logs; used by `daemon`, which passes
`control_middleware(config.control)` to `control.create_app(middleware=...)`. Pure ASGI
middleware, so streamed responses (the event stream) pass through untouched.

Why: the API selects VMs and causes GCs, and any web page in the user's browser can send
requests to 127.0.0.1. The rules, checked in this order on every HTTP request:

1. **Host** (DNS rebinding): the Host header must name loopback, with any port: ``localhost``
   (and ``*.localhost``), ``127.0.0.0/8``, ``[::1]``. When the control host is an explicit
   non-loopback bind (``[security] allow_non_loopback = true``), that host is allowed too; a
   wildcard bind (``0.0.0.0`` / ``::``) allows any IP-address Host (a rebinding attack always
   uses a DNS name). Otherwise: **421** ``{"error": ...}``. A request without Host (HTTP/1.0,
   never a browser) passes.
2. **Origin** (cross-site requests): if an ``Origin`` header is present it must be the same
   origin as the Host (``http://HOST[:PORT]``); ``Origin: null`` is refused. Browsers always
   send Origin on POST, so every state-changing request from another site is refused; the CLI,
   curl and Prometheus send none. Requests that a browser marks ``Sec-Fetch-Site: cross-site``
   or ``same-site`` are refused unless they are top-level navigations (a link to the page).
   Otherwise: **403**.
3. **Token** (``[control] token``, when set): ``Authorization: Bearer TOKEN``, or the cookie
   ``ddmd_token=TOKEN`` (what the web page and EventSource send), or once ``?token=TOKEN`` on a
   GET, which also sets that cookie (HttpOnly, SameSite=Strict), so opening
   ``http://127.0.0.1:8710/?token=TOKEN`` logs a browser in. Otherwise: **401**.

Refusals are logged as ``control.request_refused`` (rule, method, path, host, origin).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from urllib.parse import parse_qs, quote, unquote, urlsplit

from starlette.middleware import Middleware
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ddmd.config import ControlConfig, is_loopback_host
from ddmd.logs import Event, get_logger

__all__ = ["TOKEN_COOKIE", "ControlSafety", "control_middleware", "warn_if_exposed"]

log = get_logger("ddmd.safety")

TOKEN_COOKIE = "ddmd_token"
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_NAVIGATE = "navigate"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def split_host(value: str) -> tuple[str, int | None] | None:
    """``"127.0.0.1:8710"`` -> ("127.0.0.1", 8710); ``"[::1]"`` -> ("::1", None); None if
    the value is not a host[:port]."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
    elif value.count(":") > 1:
        return None  # an IPv6 address must be in brackets
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if not name:
        return None
    if not rest:
        return name.removesuffix("."), None
    if not rest.startswith(":") or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        return None
    return name.removesuffix("."), int(rest[1:])


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class ControlSafety:
    """The three rules of the module docstring, as pure ASGI middleware."""

    def __init__(self, app: ASGIApp, *, bind_host: str = "127.0.0.1", token: str = "") -> None:
        self.app = app
        self._bind = bind_host.strip("[]").lower().removesuffix(".")
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._check_host(scope) or self._check_origin(scope)
        if refusal is not None:
            await self._refuse(scope, receive, send, *refusal)
            return
        if self._token:
            how = self._authenticated(scope)
            if how is None:
                given = _header(scope, b"authorization") is not None
                message = (
                    "wrong token"
                    if given
                    else "this daemon requires its token ([control] token): send "
                    "'Authorization: Bearer TOKEN', or open /?token=TOKEN once in the browser"
                )
                await self._refuse(scope, receive, send, 401, "token", message)
                return
            if how == "query":
                send = self._setting_cookie(send)
        await self.app(scope, receive, send)

    # ------------------------------------------------------------------ rules

    def host_allowed(self, name: str) -> bool:
        if is_loopback_host(name):
            return True
        if self._bind in _WILDCARD_HOSTS:
            return _is_ip(name)
        return name == self._bind and not is_loopback_host(self._bind)

    def _check_host(self, scope: Scope) -> tuple[int, str, str] | None:
        host = _header(scope, b"host")
        if host is None:
            return None
        parsed = split_host(host)
        if parsed is None or not self.host_allowed(parsed[0]):
            return (
                421,
                "host",
                f"Host {host!r} is not a loopback name (localhost, 127.0.0.1, [::1]); "
                "ddmd refuses it to prevent DNS rebinding",
            )
        return None

    def _check_origin(self, scope: Scope) -> tuple[int, str, str] | None:
        origin = _header(scope, b"origin")
        if origin is not None and not self._same_origin(scope, origin):
            return (
                403,
                "origin",
                f"cross-origin request from {origin!r} refused; "
                "the control API answers only its own page and non-browser clients",
            )
        site = (_header(scope, b"sec-fetch-site") or "").lower()
        mode = (_header(scope, b"sec-fetch-mode") or "").lower()
        if site in ("cross-site", "same-site") and mode != _NAVIGATE:
            return (403, "origin", f"{site} request refused (Sec-Fetch-Site)")
        return None

    def _same_origin(self, scope: Scope, origin: str) -> bool:
        host = _header(scope, b"host")
        if host is None or origin.strip().lower() == "null":
            return False
        parsed = split_host(host)
        try:
            url = urlsplit(origin.strip())
            origin_port = url.port
        except ValueError:
            return False
        if parsed is None or url.hostname is None or url.path not in ("", "/"):
            return False
        scheme = str(scope.get("scheme", "http")).lower()
        if scheme == "ws":
            scheme = "http"
        elif scheme == "wss":
            scheme = "https"
        default = _DEFAULT_PORTS.get(scheme)
        host_name, host_port = parsed
        return (
            url.scheme.lower() == scheme
            and url.hostname.lower().removesuffix(".") == host_name
            and (origin_port or _DEFAULT_PORTS.get(url.scheme.lower())) == (host_port or default)
        )

    def _authenticated(self, scope: Scope) -> str | None:
        """How the request proved the token: "header", "cookie", "query", or None."""
        auth = _header(scope, b"authorization")
        if auth is not None:
            scheme, _, value = auth.strip().partition(" ")
            if scheme.lower() == "bearer" and self._matches(value.strip()):
                return "header"
        cookies = cookie_parser(_header(scope, b"cookie") or "")
        if TOKEN_COOKIE in cookies and self._matches(unquote(cookies[TOKEN_COOKIE])):
            return "cookie"
        if scope.get("method") in ("GET", "HEAD"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            if any(self._matches(v) for v in query.get("token", ())):
                return "query"
        return None

    def _matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def _setting_cookie(self, send: Send) -> Send:
        cookie = (
            f"{TOKEN_COOKIE}={quote(self._token.decode(), safe='')}; Path=/; HttpOnly; "
            "SameSite=Strict"
        ).encode("latin-1")

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((b"set-cookie", cookie))
                message = {**message, "headers": headers}
            await send(message)

        return wrapped

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, rule: str, message: str
    ) -> None:
        log.info(
            Event.CONTROL_REQUEST_REFUSED,
            rule=rule,
            status=status,
            method=scope.get("method"),
            path=scope.get("path"),
            host=_header(scope, b"host"),
            origin=_header(scope, b"origin"),
        )
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = JSONResponse({"error": message}, status_code=status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="ddmd"'
        await response(scope, receive, send)


def control_middleware(control: ControlConfig) -> Sequence[Middleware]:
    """The middleware list for ``control.create_app``: every rule, configured from [control]."""
    return [Middleware(ControlSafety, bind_host=control.host, token=control.token)]


def warn_if_exposed(host: str, port: int) -> None:
    """Log ``listener.non_loopback`` when the control API listens beyond loopback."""
    if not is_loopback_host(host):
        log.warning(Event.LISTENER_NON_LOOPBACK, host=host, port=port, key="control.host")

"""The HTTP side of the WebSocket server: which request gets which answer.

Every request's ``Host`` header must name a host the server is meant to be reached at
(``allowed_hosts``; a DNS-rebound page is refused with 400). The endpoint (``mount``) accepts
WebSocket handshakes from allowed origins (403 otherwise, 426 for plain GETs); the browser
script and files under ``static_dir`` (:mod:`transports.web_files`) are served with ETag,
304, Cache-Control and gzip (when ``Accept-Encoding`` gives it a q-value above 0), to GET
and HEAD (other methods: 405). No sockets here: requests in, ``Response`` objects out (or a
future of one while its file loads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import socket
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.server import ServerProtocol

from transports.web_files import SCRIPT_NAMES, Asset, StaticFiles, script_asset

log = logging.getLogger("peerwire.transports.websocket")

SERVER_HEADER = "peerwire"
_SINGLE_HEADERS = ("Host", "Upgrade", "Origin")
"""Headers read as one value: a request that repeats one gets 400."""


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """What the WebSocket server answers besides the endpoint itself, and its limits."""

    mount: str = "/gotalk/"
    origins: Sequence[str] | None = None
    """Allowed Origin values (scheme://host[:port]; case and a trailing slash do not matter);
    None = same origin: the Origin's host:port must be the Host header's, an allowed host;
    ["*"] = any."""
    allow_missing_origin: bool = False
    """Non-browser clients may omit Origin (the Go server refuses that with 403)."""
    static_dir: Path | None = None
    cache_control: str = "public,max-age=300"
    allowed_hosts: Sequence[str] | None = None
    """Host header values accepted (host names without port, case-insensitive; ``".x.org"``
    also matches subdomains; ``"*"`` any). None = the listening address, plus ``localhost``
    for loopback servers; a wildcard listener (0.0.0.0, ::) also accepts any IP literal and
    the machine's host name. Others get 400."""
    handshake_timeout: float = 10.0
    """Seconds from accept (TLS included) to a completed upgrade; then the socket is closed
    (``rpc.serve`` uses the lower of this and ``Options.handshake_timeout``)."""
    max_request_head: int = 16 * 1024
    """Bytes of request line and headers a connection may send before its upgrade; more: 431."""
    static_cache_bytes: int = 32 * 1024 * 1024
    """Bytes of file contents (plain and gzipped) kept in the static file cache; a file over
    a quarter of it is not served (404)."""


# --- hosts and origins -----------------------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (IPv6 in brackets) -> (lower-case host without trailing dot, port)."""
    parts = urllib.parse.urlsplit("//" + value.strip())
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.path or parts.query or parts.username is not None:
        return None
    return host.rstrip("."), port


def normalise_origin(origin: str) -> str | None:
    """``Scheme://Host:port/`` -> ``scheme://host[:port]`` (default ports left out)."""
    parts = urllib.parse.urlsplit(origin.strip())
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if not scheme or not host or parts.path not in ("", "/"):
        return None
    default = {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(scheme)
    host = host.rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class HostCheck:
    """Matches Host header hosts against ``allowed_hosts`` (see :class:`HttpOptions`)."""

    def __init__(self, allowed: Iterable[str], *, any_ip: bool = False) -> None:
        names = {name.strip().lower().rstrip(".").strip("[]") for name in allowed}
        self.any = "*" in names
        self.any_ip = any_ip
        self.exact = frozenset(n for n in names if not n.startswith("."))
        self.suffixes = tuple(n for n in names if n.startswith("."))

    @classmethod
    def default(cls, bind_host: str | None, bound: Iterable[str]) -> HostCheck:
        """The listening address, ``localhost`` for loopback, any IP for wildcard ones."""
        addresses = {ipaddress.ip_address(a.split("%")[0]) for a in bound}
        names = {str(a) for a in addresses}
        if bind_host and not _is_ip(bind_host):
            names.add(bind_host)
        wildcard = any(a.is_unspecified for a in addresses)
        if wildcard or any(a.is_loopback for a in addresses):
            names.add("localhost")
        if wildcard:
            names.add(socket.gethostname())
        return cls(names, any_ip=wildcard)

    def allows(self, host: str) -> bool:
        if self.any or host in self.exact:
            return True
        if self.any_ip and _is_ip(host):
            return True
        return any(host.endswith(s) or host == s[1:] for s in self.suffixes)


# --- the responder ---------------------------------------------------------------------------


def _headers(**items: str) -> Headers:
    headers = Headers(Server=SERVER_HEADER, Connection="close")
    for name, value in items.items():
        headers[name.replace("_", "-")] = value
    return headers


def _list_header(request: Request, name: str) -> list[str]:
    """A list-valued header's items, its repeated lines combined (RFC 9110, 5.3)."""
    return [item.strip() for line in request.headers.get_all(name) for item in line.split(",")]


def accepts_gzip(request: Request) -> bool:
    """Whether ``Accept-Encoding`` gives gzip (or ``x-gzip``, else ``*``) a q-value above 0
    (RFC 9110, 12.5.3: ``gzip;q=0`` refuses it; a q-value that is not a number counts as 0)."""
    weights: dict[str, float] = {}
    for item in _list_header(request, "Accept-Encoding"):
        coding, *params = item.split(";")
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value.strip())
                except ValueError:
                    weight = 0.0
        weights[coding.strip().lower()] = weight
    for coding in ("gzip", "x-gzip", "*"):
        if coding in weights:
            return weights[coding] > 0  # (NaN too: not above 0)
    return False


def serve_asset(request: Request, asset: Asset, cache_control: str) -> Response:
    gzipped = asset.gzipped if asset.gzipped is not None and accepts_gzip(request) else None
    # the gzipped body is another representation: a tag of its own (RFC 9110, 8.8.3)
    etag = asset.etag if gzipped is None else f'{asset.etag[:-1]}-gzip"'
    headers = _headers(
        Content_Type=asset.content_type,
        ETag=etag,
        Cache_Control=cache_control,
        Vary="Accept-Encoding",
    )
    tags = {tag.removeprefix("W/") for tag in _list_header(request, "If-None-Match")}
    if etag in tags or "*" in tags:
        return Response(304, "Not Modified", headers, b"")
    body = asset.body
    if gzipped is not None:
        body = gzipped
        headers["Content-Encoding"] = "gzip"
    headers["Content-Length"] = str(len(body))
    return Response(200, "OK", headers, body)


def for_method(request: Request, response: Response) -> Response:
    """``response`` as the answer to ``request``'s method: to a HEAD, the same status and
    headers (``Content-Length`` included) without the body (RFC 9110, 9.3.2)."""
    if request.method == "HEAD" and response.body:
        return dataclasses.replace(response, body=b"")
    return response


def refuse(ws: ServerProtocol, status: int, text: str) -> Response:
    """A plain-text refusal (``ws.reject`` with our Server header)."""
    response = ws.reject(status, text)
    response.headers["Server"] = SERVER_HEADER
    return response


class Responder:
    """Answers one server's HTTP requests (see the module docstring)."""

    def __init__(self, options: HttpOptions, hosts: HostCheck) -> None:
        mount = options.mount if options.mount.startswith("/") else "/" + options.mount
        self.mount = mount if mount.endswith("/") else mount + "/"
        self.options = options
        self.hosts = hosts
        self.scripts = {self.mount + name: script_asset() for name in SCRIPT_NAMES}
        self.origins: frozenset[str | None] | None = None
        if options.origins is not None:
            self.origins = frozenset(
                "*" if o == "*" else normalise_origin(o) for o in options.origins
            )
        self.static = (
            StaticFiles(options.static_dir, options.static_cache_bytes)
            if options.static_dir is not None
            else None
        )

    def respond(self, request: Request, ws: ServerProtocol) -> Response | asyncio.Future[Response]:
        """The response to ``request``: 101 (``ws.accept``) or any other status; for a
        static file not in the cache, a future of it (done once the file is loaded). A
        HEAD gets the GET's status and headers, no body; other methods get 405."""
        response = self._respond(request, ws)
        if isinstance(response, asyncio.Future):
            return response
        return for_method(request, response)

    def _respond(self, request: Request, ws: ServerProtocol) -> Response | asyncio.Future[Response]:
        for name in _SINGLE_HEADERS:
            if len(request.headers.get_all(name)) > 1:
                log.info("refused HTTP request: repeated %s header", name)
                return refuse(ws, 400, f"Bad Request: repeated {name} header\n")
        host_header = request.headers.get("Host")
        host = split_host(host_header) if host_header else None
        if host is None or not self.hosts.allows(host[0]):
            reason = f"Host header {host_header!r} is not an allowed host (allowed_hosts)"
            log.info("refused HTTP request: %s", reason)
            return refuse(ws, 400, f"Bad Request: {reason}\n")
        if request.method not in ("GET", "HEAD"):  # (websockets' parser takes any token)
            response = refuse(ws, 405, "Method Not Allowed\n")
            response.headers["Allow"] = "GET, HEAD"
            return response
        path = request.path.split("?", 1)[0]
        asset = self.scripts.get(path)
        if asset is not None:
            return serve_asset(request, asset, self.options.cache_control)
        if path in (self.mount, self.mount[:-1]):
            if request.headers.get("Upgrade", "").lower() != "websocket":
                return refuse(ws, 426, "this is a WebSocket endpoint\n")
            refusal = self._origin_refusal(request, host)
            if refusal is not None:
                log.info("refused WebSocket handshake: %s", refusal)
                return refuse(ws, 403, f"Forbidden: {refusal}\n")
            response = ws.accept(request)
            response.headers["Server"] = SERVER_HEADER
            return response
        if self.static is not None:
            found = self.static.get(path)
            if isinstance(found, asyncio.Future):
                return self._when_loaded(found, request, ws)
            if found is not None:
                return serve_asset(request, found, "no-cache")
        return refuse(ws, 404, "Not Found\n")

    def _when_loaded(
        self, loading: asyncio.Future[Asset | None], request: Request, ws: ServerProtocol
    ) -> asyncio.Future[Response]:
        answer: asyncio.Future[Response] = loading.get_loop().create_future()

        def loaded(_: object) -> None:
            asset = None if loading.cancelled() else loading.result()
            try:
                if asset is None:
                    response = refuse(ws, 404, "Not Found\n")
                else:
                    response = serve_asset(request, asset, "no-cache")
                answer.set_result(for_method(request, response))
            except Exception as exc:  # the server reports it as any failed request
                answer.set_exception(exc)

        loading.add_done_callback(loaded)
        return answer

    def close(self) -> None:
        """The server closed: static file loads not started are dropped."""
        if self.static is not None:
            self.static.close()

    def _origin_refusal(self, request: Request, host: tuple[str, int | None]) -> str | None:
        origin = request.headers.get("Origin")
        if origin is None:
            return None if self.options.allow_missing_origin else "missing Origin header"
        normal = normalise_origin(origin)
        if self.origins is not None:
            if "*" in self.origins or (normal is not None and normal in self.origins):
                return None
            return f"origin {origin} is not allowed"
        parts = urllib.parse.urlsplit(normal or "")
        if normal is None or parts.scheme not in ("http", "https"):
            return f"origin {origin} is not an http(s) origin"
        origin_port = parts.port or (443 if parts.scheme == "https" else 80)
        origin_host = (parts.hostname or "").rstrip(".")
        same = origin_host == host[0] and (
            host[1] == origin_port or (host[1] is None and origin_port in (80, 443))
        )
        if not same or not self.hosts.allows(origin_host):
            return f"origin {origin} is not the same origin as {request.headers['Host']}"
        return None

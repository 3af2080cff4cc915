"""peerwire URLs: ``<transport>+<codec>://host:port[/path][?dialect=...]``.

=====================  ===========  ========  ============================================
scheme                 transport    codec     notes
=====================  ===========  ========  ============================================
``tcp+sbs``            TCP          Chatter   ``?dialect=Hat`` (default) or ``HatChatter``
``ssl+sbs``            TLS          Chatter   as above
``tcp+gotalk``         TCP          Gotalk
``ssl+gotalk``         TLS          Gotalk
``ws+gotalk``          WebSocket    Gotalk    path = the endpoint's mount (default /gotalk/)
``wss+gotalk``         WebSocket    Gotalk    over TLS
``ws+sbs``             WebSocket    Chatter   binary messages carrying Chatter frames
``wss+sbs``            WebSocket    Chatter   over TLS
=====================  ===========  ========  ============================================

A server ignores ``dialect``: it detects it from each connection's first frame.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from wire.chatter import Dialect

TRANSPORTS = {"tcp": False, "ssl": True, "ws": False, "wss": True}
DEFAULT_MOUNT = "/gotalk/"
CODECS = ("sbs", "gotalk")


class UrlError(ValueError):
    """A URL peerwire cannot use."""


@dataclass(slots=True, frozen=True)
class PeerUrl:
    transport: str
    codec: str
    host: str
    port: int
    path: str
    dialect: Dialect | None

    @property
    def tls(self) -> bool:
        return TRANSPORTS[self.transport]

    @property
    def websocket(self) -> bool:
        return self.transport in ("ws", "wss")

    @property
    def websocket_uri(self) -> str:
        """The plain ``ws://``/``wss://`` address of a WebSocket URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.transport}://{host}:{self.port}{self.path}"

    def with_port(self, port: int) -> PeerUrl:
        return PeerUrl(self.transport, self.codec, self.host, port, self.path, self.dialect)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.transport}+{self.codec}://{host}:{self.port}{self.path}"
        if self.dialect is not None:
            text += f"?dialect={self.dialect.value}"
        return text


def parse_url(url: str) -> PeerUrl:
    parts = urllib.parse.urlsplit(url)
    transport, _, codec = parts.scheme.partition("+")
    if transport not in TRANSPORTS or codec not in CODECS:
        raise UrlError(
            f"unsupported scheme {parts.scheme!r} in {url!r}; use one of "
            + ", ".join(f"{t}+{c}" for t in TRANSPORTS for c in CODECS)
        )
    try:
        port = parts.port
    except ValueError as exc:
        raise UrlError(f"bad port in {url!r}: {exc}") from None
    if port is None or not parts.hostname:
        raise UrlError(f"{url!r} needs host and port")
    query = urllib.parse.parse_qs(parts.query)
    dialect = None
    if "dialect" in query:
        if codec != "sbs":
            raise UrlError("dialect applies to Chatter (sbs) URLs only")
        try:
            dialect = Dialect(query["dialect"][-1])
        except ValueError:
            raise UrlError(
                f"dialect must be Hat or HatChatter, not {query['dialect'][-1]!r}"
            ) from None
    path = parts.path
    if transport in ("ws", "wss"):
        path = path or DEFAULT_MOUNT
    elif path not in ("", "/"):
        raise UrlError(f"{transport}+{codec} URLs take no path: {url!r}")
    else:
        path = ""
    return PeerUrl(transport, codec, parts.hostname, port, path, dialect)

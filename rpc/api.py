"""``connect(url)`` and ``serve(url)``: the entry points that pick transport and codec."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import socket
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
)

from rpc.backoff import Reconnect
from rpc.chatter_peer import ChatterAdapter, ChatterPeer
from rpc.dial import dialer, in_own_context
from rpc.errors import ConnectionClosed
from rpc.gotalk_peer import GotalkAdapter, GotalkPeer
from rpc.middleware import Middleware
from rpc.peer import Options, Peer
from rpc.reconnect import ReconnectingPeer, Transition
from rpc.registry import Registry, default_registry
from rpc.url import PeerUrl, parse_url
from transports.stream import (
    server_address,
    start_stream_server,
)
from transports.websocket import HttpOptions, start_websocket_server
from wire import schemas
from wire.chatter import Dialect

if TYPE_CHECKING:
    import hat.sbs

P = TypeVar("P", bound="Peer[Any] | ReconnectingPeer")


class Meter(Protocol):
    """What ``serve(metrics=...)`` and ``connect(metrics=...)`` take (:class:`rpc.metrics.Metrics`
    is one): a middleware for the calls, and for servers the connections."""

    @property
    def middleware(self) -> Middleware: ...

    def admitted(self, peer: Peer, protocol: str) -> asyncio.BaseProtocol:
        """The protocol the transport drives for an admitted connection (it passes every
        event on to ``peer``)."""
        ...

    def refused(self, protocol: str) -> None: ...


def _with_middleware(
    options: Options | None, middleware: Sequence[Middleware], metrics: Meter | None
) -> Options | None:
    """``options`` with the metrics' middleware (outermost), then ``middleware``, first."""
    extra = ((metrics.middleware,) if metrics is not None else ()) + tuple(middleware)
    if not extra:
        return options
    options = options or Options()
    return dataclasses.replace(options, middleware=(*extra, *options.middleware))


def _peer_class(url: PeerUrl) -> type[Peer]:
    return GotalkPeer if url.codec == "gotalk" else ChatterPeer


def _check_protocol_options(peer_class: type[Peer], protocol_options: dict[str, Any]) -> None:
    """TypeError for a keyword the protocol's peer does not take, at the call of ``serve``
    or ``connect``: else a server would fail each connection as it came, its clients seeing
    only a closed connection (or, over WebSocket, one that never answers)."""
    parameters = inspect.signature(peer_class).parameters
    for name in protocol_options:
        if name not in parameters or name in ("registry", "options", "dialect"):
            hint = ""
            if name in {field.name for field in dataclasses.fields(Options)}:
                hint = f"; it is an Options field: options=rpc.Options({name}=...)"
            elif name == "dialect":
                hint = "; a Chatter URL names it: ?dialect=Hat or ?dialect=HatChatter"
            raise TypeError(f"{peer_class.__name__} takes no keyword {name!r}{hint}")


def _peer_factory(
    url: PeerUrl,
    registry: Registry | None,
    options: Options | None,
    server: bool,
    protocol_options: dict[str, Any],
) -> Callable[[], Peer]:
    if not server:
        protocol_options = {"extensions": True, **protocol_options}
    _check_protocol_options(_peer_class(url), protocol_options)
    if url.codec == "gotalk":
        return lambda: GotalkPeer(registry, options, **protocol_options)
    dialect = None if server else (url.dialect or Dialect.LEGACY)
    # the schemas are read here, once per process (hat-sbs' import and parse take ~0.3 s),
    # so that a server's first client does not wait for them in its handshake
    repo = protocol_options.get("sbs_repo") or schemas.repository()
    chatter_options = {**protocol_options, "sbs_repo": repo}
    return lambda: ChatterPeer(registry, options, dialect=dialect, **chatter_options)


class _Connect(Generic[P]):
    """Awaitable and async context manager returned by :func:`connect`."""

    def __init__(self, coro_fn: Callable[[], Awaitable[P]]) -> None:
        self._coro_fn: Callable[[], Awaitable[P]] = coro_fn
        self._peer: P | None = None

    def __await__(self) -> Generator[Any, None, P]:
        return self._coro_fn().__await__()

    async def __aenter__(self) -> P:
        self._peer = await self._coro_fn()
        return self._peer

    async def __aexit__(self, *exc: object) -> None:
        if self._peer is not None:
            await self._peer.close()


class ConnectKeywords(TypedDict, total=False):
    """The keywords :func:`connect` takes besides ``url`` and ``reconnect``: its own, then
    the protocol peer's (Gotalk: ``heartbeat_interval``, ``read_timeout``; Chatter:
    ``ping_interval``, ``ping_timeout``, ``strict``, ``sbs_repo``; both: ``extensions``,
    ``retry_results``). Defaults as documented by :func:`connect`,
    :class:`~rpc.gotalk_peer.GotalkPeer` and :class:`~rpc.chatter_peer.ChatterPeer`."""

    registry: Registry | None
    options: Options | None
    ssl: ssl_module.SSLContext | None
    server_hostname: str | None
    connect_timeout: float
    origin: str | None
    middleware: Sequence[Middleware]
    metrics: Meter | None
    on_connect: Callable[[Peer], Any] | None
    on_state: Callable[[Transition], Any] | None
    heartbeat_interval: float | None
    read_timeout: float | None
    retry_results: bool | None
    ping_interval: float | None
    ping_timeout: float
    strict: bool
    sbs_repo: hat.sbs.Repository | None
    extensions: bool


@overload
def connect(
    url: str | Sequence[str], *, reconnect: Literal[False], **keywords: Unpack[ConnectKeywords]
) -> _Connect[Peer]: ...


@overload
def connect(
    url: str | Sequence[str],
    *,
    reconnect: Literal[True] | Reconnect = True,
    **keywords: Unpack[ConnectKeywords],
) -> _Connect[ReconnectingPeer]: ...


@overload
def connect(
    url: str | Sequence[str], *, reconnect: bool | Reconnect, **keywords: Unpack[ConnectKeywords]
) -> _Connect[Peer | ReconnectingPeer]: ...


def connect(
    url: str | Sequence[str],
    *,
    registry: Registry | None = None,
    options: Options | None = None,
    ssl: ssl_module.SSLContext | None = None,
    server_hostname: str | None = None,
    connect_timeout: float = 10.0,
    origin: str | None = None,
    middleware: Sequence[Middleware] = (),
    metrics: Meter | None = None,
    reconnect: bool | Reconnect = True,
    on_connect: Callable[[Peer], Any] | None = None,
    on_state: Callable[[Transition], Any] | None = None,
    **protocol_options: Any,
) -> _Connect[Any]:
    """Connect to a peer: ``peer = await connect(url)`` or ``async with connect(url) as peer``.

    Returns a :class:`~rpc.reconnect.ReconnectingPeer`, which reconnects by itself after
    its connection drops (``reconnect``: a :class:`~rpc.reconnect.Reconnect` policy, or
    True for the default one) and fails over between several URLs given as a list (all of
    one protocol); ``on_connect(peer)`` runs on each new connection before our requests go
    out, ``on_state(transition)`` sees every state change (see :mod:`rpc.reconnect`).
    ``reconnect=False`` returns the :class:`Peer` of one connection (the first URL that
    answers), which stays closed once it drops.

    ``registry`` holds the handlers the remote side may call on us (default: the module
    registry). ``ssl`` overrides the default TLS client context (system CAs, hostname
    checked). ``middleware`` wrap every call on the connection (:mod:`rpc.middleware`);
    ``metrics`` (:class:`rpc.metrics.Metrics`) counts our calls. ``protocol_options`` go to
    the protocol peer (``ping_interval``, ``heartbeat_interval``, ...).
    """
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("connect needs at least one URL")
    parsed = [parse_url(u) for u in urls]
    codecs = {p.codec for p in parsed}
    if len(codecs) > 1:
        raise ValueError(f"the URLs of one client speak one protocol, not {sorted(codecs)}")
    options = _with_middleware(options, middleware, metrics)
    if reconnect is False and on_state is not None:
        raise ValueError("on_state needs reconnect (a connection without it has no states)")

    def dialers() -> dict[str, Callable[[], Awaitable[Peer]]]:
        return {
            u: dialer(
                u,
                p,
                _peer_factory(p, registry, options, False, protocol_options),
                options,
                ssl,
                server_hostname,
                connect_timeout,
                origin,
            )
            for u, p in zip(urls, parsed, strict=True)
        }

    async def one_connection() -> Peer:
        error: BaseException = ConnectionClosed("no URL")
        for dial in dialers().values():
            try:
                peer = await dial()
            except ConnectionClosed as exc:
                error = exc
                continue
            if on_connect is not None:
                try:
                    result = on_connect(peer)
                    if inspect.isawaitable(result):
                        await result
                except BaseException:
                    peer.abort()
                    raise
            return peer
        raise error

    async def reconnecting() -> ReconnectingPeer:
        dial = dialers()
        client = ReconnectingPeer(
            urls,
            lambda u: dial[u](),
            registry=registry if registry is not None else default_registry,
            options=options or Options(),
            protocol_name="gotalk" if parsed[0].codec == "gotalk" else "chatter",
            default_timeout=(
                GotalkAdapter.default_timeout
                if parsed[0].codec == "gotalk"
                else ChatterAdapter.default_timeout
            ),
            policy=reconnect if isinstance(reconnect, Reconnect) else Reconnect(),
            on_connect=on_connect,
            on_state=on_state,
        )
        await client.start()
        return client

    if reconnect is False:
        return _Connect(one_connection)
    return _Connect(reconnecting)


def _close_server(server: asyncio.AbstractServer) -> None:
    server.close()  # asyncio's, uvloop's, TlsServer, WebSocketServer


class Server:
    """A listening server; every accepted connection is a :class:`Peer` in :attr:`peers`."""

    def __init__(
        self,
        url: PeerUrl,
        registry: Registry | None,
        options: Options | None,
        ssl: ssl_module.SSLContext | None,
        max_connections: int,
        protocol_options: dict[str, Any],
        on_connect: Callable[[Peer], Any] | None = None,
        web: HttpOptions | None = None,
        sock: socket.socket | None = None,
        metrics: Meter | None = None,
    ) -> None:
        self.requested_url = url
        self.url = url
        self.peers: set[Peer] = set()
        self.max_connections = max_connections
        self.refused = 0
        """Connections closed at once because ``max_connections`` were open."""
        self._factory = _peer_factory(url, registry, options, True, protocol_options)
        self._metrics = metrics
        self._protocol = "gotalk" if url.codec == "gotalk" else "chatter"
        self._on_connect = on_connect
        self._web = web
        self._options = options or Options()
        self._max_size = self._options.max_size
        self._ssl = ssl
        self._sock = sock
        self._server: Any = None  # asyncio.Server or websockets Server (same interface)

    def _new_peer(self) -> Any:
        """The protocol for an accepted connection (its peer, or what ``metrics`` wraps it
        in), or None past ``max_connections`` (counting connections whose TLS or WebSocket
        handshake is still running)."""
        if len(self.peers) >= self.max_connections:
            self.refused += 1
            if self._metrics is not None:
                self._metrics.refused(self._protocol)
            return None
        peer = self._factory()
        peer.accepted_at = peer.loop.time()
        self.peers.add(peer)
        peer.on_open = self._on_connect
        peer.closed.add_done_callback(lambda _: self.peers.discard(peer))
        if self._metrics is not None:
            return self._metrics.admitted(peer, self._protocol)
        return peer

    async def start(self) -> Server:
        if self.url.tls and self._ssl is None:
            raise ValueError(f"{self.url} needs an ssl= server context (certificate and key)")
        if self._ssl is not None and not self.url.tls:
            raise ValueError(f"ssl= given for {self.url}, which is not a TLS URL")
        if self.url.websocket:
            web = self._web or HttpOptions()
            limit = self._options.handshake_timeout  # counts the upgrade too (from accept)
            if limit and limit < web.handshake_timeout:  # 0, None: no limit of the peer's
                web = dataclasses.replace(web, handshake_timeout=limit)
            web = dataclasses.replace(web, mount=self.url.path)
            max_size = self._max_size + 4096  # room for one Gotalk header beside the payload
            self._server = await in_own_context(
                start_websocket_server(
                    self.url.host,
                    self.url.port,
                    self._new_peer,
                    http=web,
                    ssl_context=self._ssl,
                    max_size=max_size,
                    max_connections=self.max_connections,
                    sock=self._sock,
                    min_rate=self._options.min_receive_rate,
                    rate_grace=self._options.receive_grace,
                ),
                _close_server,
            )
        else:
            options = self._options
            self._server = await in_own_context(
                start_stream_server(
                    self.url.host,
                    self.url.port,
                    self._new_peer,
                    ssl_context=self._ssl,
                    handshake_timeout=options.handshake_timeout or 60.0,
                    sock=self._sock,
                ),
                _close_server,
            )
        self.url = self.url.with_port(server_address(self._server)[1])
        return self

    async def close(self, *, drain_timeout: float = 5.0) -> None:
        """Stop accepting, then close every connection gracefully."""
        if self._server is not None:
            if self.url.websocket:  # keep connections open: they are drained below
                self._server.close(close_connections=False)
            else:
                self._server.close()
        await asyncio.gather(
            *(p.close(drain_timeout=drain_timeout) for p in list(self.peers)),
            return_exceptions=True,
        )
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __await__(self) -> Generator[Any, None, Server]:
        return self.start().__await__()


def check_serve_keywords(url: str, keywords: dict[str, Any]) -> None:
    """TypeError for a keyword of ``keywords`` that neither :func:`serve` nor the peer of
    ``url``'s protocol takes (as ``serve`` itself raises): for :mod:`rpc.workers`, which
    passes them to ``serve`` in each worker and checks them once, before forking."""
    named = inspect.signature(serve).parameters
    protocol_options = {name: value for name, value in keywords.items() if name not in named}
    _check_protocol_options(_peer_class(parse_url(url)), protocol_options)


def serve(
    url: str,
    *,
    registry: Registry | None = None,
    options: Options | None = None,
    ssl: ssl_module.SSLContext | None = None,
    max_connections: int = 10_000,
    on_connect: Callable[[Peer], Any] | None = None,
    web: HttpOptions | None = None,
    sock: socket.socket | None = None,
    middleware: Sequence[Middleware] = (),
    metrics: Meter | None = None,
    **protocol_options: Any,
) -> Server:
    """Serve ``registry``'s handlers on ``url``: ``async with serve(url) as server``.

    Port 0 picks a free port; ``server.url`` is the bound URL. TLS URLs need ``ssl``.
    ``on_connect(peer)`` runs for every accepted connection (sync or async: a coroutine
    runs as a task of the connection, and the peer's requests are served meanwhile, so it
    may make requests of its own to the peer); if it raises, the connection is closed (a
    rate-limited ERROR line with the traceback). Connections past ``max_connections`` are
    closed at once. WebSocket URLs serve their endpoint at the
    URL's path; ``web`` sets allowed origins, a static folder and the like. ``sock``, an
    already bound TCP socket, is served instead of binding the URL's host and port (which
    then only name it); :mod:`rpc.workers` passes one per worker process.
    ``middleware`` wrap every call on every connection (:mod:`rpc.middleware`); ``metrics``
    (:class:`rpc.metrics.Metrics`) counts calls, connections and bytes. Other keywords go
    to the protocol's peer (``GotalkPeer``, ``ChatterPeer``); one it does not take raises
    TypeError here, not at each connection.
    """
    return Server(
        parse_url(url),
        registry,
        _with_middleware(options, middleware, metrics),
        ssl,
        max_connections,
        protocol_options,
        on_connect,
        web,
        sock,
        metrics,
    )

"""Opening one connection: a dialer per URL (transport, TLS, the first reply that tells
whether the server took us) and the errors ``connect`` raises when it cannot."""

from __future__ import annotations

import asyncio
import contextvars
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from websockets.exceptions import InvalidHandshake

from rpc.chatter_peer import ChatterPeer
from rpc.errors import TLS_ERRORS, ConnectionClosed
from rpc.peer import Options, Peer
from rpc.url import PeerUrl
from transports.stream import (
    ClosedBeforeReply,
    TlsFailure,
    client_ssl_context,
    open_stream,
    tls_failure,
)
from transports.websocket import open_websocket
from transports.ws_transport import RETRY_FLAG
from wire.chatter import Dialect

T = TypeVar("T")


async def in_own_context(opening: Coroutine[Any, Any, T], undo: Callable[[T], Any]) -> T:
    """Await ``opening`` (a connection or a server being made) in a context of its own. Its
    transport copies the current context into every callback it schedules, so a connection
    opened inside a served call (a proxy's handler) would otherwise run its handlers, for
    its whole life, with that call's context variables: ``rpc.current_call`` and its
    deadline, a trace's current span, the application's own. Cancelled just as ``opening``
    made what it makes, ``undo`` closes that: nobody would hold it."""
    task = asyncio.get_running_loop().create_task(opening, context=contextvars.Context())
    try:
        return await task
    except asyncio.CancelledError:
        if task.done() and not task.cancelled() and task.exception() is None:
            undo(task.result())
        raise


def _abort(protocol: object) -> None:
    if isinstance(protocol, Peer):
        protocol.abort()


def _draw_reply(peer: Peer) -> None:
    """Make the server say something at once, so that ``connect`` learns whether it accepted
    us: Gotalk servers send their version unasked; a Chatter client that did not announce
    its extensions (a Ping) sends a plain Ping (Hat peers answer every Ping)."""
    if not isinstance(peer, ChatterPeer):
        return
    if not (peer.chatter.extensions and peer.codec.dialect is Dialect.CURRENT):
        peer.codec.send_ping()
        peer.outbox.push(peer.codec.data_to_send())
        peer.outbox.flush()


def _connect_error(url: str, parsed: PeerUrl, exc: BaseException) -> ConnectionClosed:
    """The error ``connect`` raises: a :class:`TlsError` subclass when TLS says why."""
    failure = exc if isinstance(exc, TlsFailure) else None
    if failure is None and parsed.tls and parsed.websocket:
        if isinstance(exc, ssl_module.SSLError | ConnectionResetError):  # during TLS
            failure = tls_failure(exc, handshake_done=False)
        else:  # the upgrade failed after the TLS handshake: closed, or an HTTP answer
            closed = not isinstance(exc, InvalidHandshake) or isinstance(exc.__cause__, EOFError)
            if closed:
                failure = tls_failure(ClosedBeforeReply(), handshake_done=True)
    if failure is not None:
        return TLS_ERRORS[failure.kind](f"cannot connect to {url}: {failure}")
    closed = isinstance(exc, ClosedBeforeReply | ConnectionResetError) or (
        isinstance(exc, InvalidHandshake) and isinstance(exc.__cause__, EOFError)
    )
    if closed and not parsed.tls:
        return ConnectionClosed(
            f"cannot connect to {url}: the server closed the connection before its first "
            "byte: it may expect TLS on this port (an ssl+ or wss+ URL), or it refused the "
            "connection (max_connections)"
        )
    return ConnectionClosed(f"cannot connect to {url}: {exc}")


def dialer(
    url: str,
    parsed: PeerUrl,
    factory: Callable[[], Peer],
    options: Options | None,
    ssl: ssl_module.SSLContext | None,
    server_hostname: str | None,
    connect_timeout: float,
    origin: str | None,
) -> Callable[[], Awaitable[Peer]]:
    """Opens one connection to ``url`` (ConnectionClosed when it cannot)."""
    if ssl is not None and not parsed.tls:
        raise ValueError(f"ssl= given for {url}, which is not a TLS URL")

    websocket_uri = parsed.websocket_uri
    if parsed.codec == "gotalk":  # we take Gotalk retry results: a peerwire server then
        # sends them, as to its own browser client (else it treats us as gotalk.js)
        websocket_uri += f"?{RETRY_FLAG}=1"

    async def dial() -> Peer:
        ctx = ssl if ssl is not None else (client_ssl_context() if parsed.tls else None)
        made = factory()  # first: a protocol option it refuses leaves no socket behind
        peer: object  # the transport's protocol: checked to be a Peer below
        try:
            if parsed.websocket:
                opts = options or Options()
                peer = await in_own_context(
                    open_websocket(
                        websocket_uri,
                        lambda: made,
                        ssl_context=ctx,
                        server_hostname=server_hostname,
                        origin=origin,
                        max_size=opts.max_size + 4096,
                        connect_timeout=connect_timeout,
                        min_rate=opts.min_receive_rate,
                        rate_grace=opts.receive_grace,
                    ),
                    _abort,
                )
            else:
                peer = await in_own_context(
                    open_stream(
                        parsed.host,
                        parsed.port,
                        lambda: made,
                        ssl_context=ctx,
                        server_hostname=server_hostname or parsed.host,
                        connect_timeout=connect_timeout,
                        first_reply=_draw_reply if parsed.tls or parsed.codec == "gotalk" else None,
                    ),
                    _abort,
                )
        except TimeoutError:
            raise ConnectionClosed(f"connecting to {url} timed out") from None
        except (OSError, InvalidHandshake) as exc:  # refused, unreachable, TLS, WS handshake
            if made.gave_up is not None:  # we cut it (no handshake in time): not the server
                raise ConnectionClosed(f"cannot connect to {url}: {made.gave_up}") from exc
            cause = exc.__cause__ if isinstance(exc, TlsFailure) else exc
            raise _connect_error(url, parsed, exc) from cause
        if not isinstance(peer, Peer):
            raise TypeError(f"transport returned {peer!r}, not a Peer")
        return peer

    return dial

"""The listening sockets of :func:`rpc.workers.serve_workers`: the parent binds every URL
once (port 0 resolved there, so every worker serves the same port); each worker then takes
its sockets from that.

On Linux (:data:`REUSE_PORT`) the parent's sockets are bound, never listening, and only
reserve the port while workers restart; each worker binds and listens on its own
``SO_REUSEPORT`` socket per address, and the kernel spreads new connections over them.
Elsewhere the parent listens and the workers accept from the sockets they inherit.
"""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rpc.url import PeerUrl, parse_url

REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
"""Whether workers bind their own ``SO_REUSEPORT`` sockets here (Linux spreads connections
over them); elsewhere they share the parent's listening socket."""

BACKLOG = 1024
"""Connections a listening socket queues before they are accepted."""


@dataclass(frozen=True)
class Listener:
    """One URL, bound by the parent: its resolved URL, addresses and the parent's sockets."""

    url: PeerUrl
    addresses: tuple[tuple[socket.AddressFamily, tuple[Any, ...]], ...]
    sockets: tuple[socket.socket, ...]


def _bind(
    family: socket.AddressFamily,
    address: tuple[Any, ...],
    *,
    reuse_port: bool,
    reuse_address: bool = True,
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse_address:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _reserve(family: socket.AddressFamily, address: tuple[Any, ...]) -> socket.socket:
    """A bound, never listening, ``SO_REUSEPORT`` socket that holds the port for the workers.

    Without ``SO_REUSEADDR`` no other server can take the port even while no worker listens;
    but then connections of an earlier server left in TIME_WAIT block the bind, so that case
    falls back to ``SO_REUSEADDR``. ``SO_REUSEPORT`` lets any socket of the same user that
    has it too bind beside ours: another worker server's, whose port would then be shared,
    connections spread over both. So a given port is first bound without it (and closed):
    that fails if anything listens there, or holds it as we do.
    """
    if address[1]:
        _bind(family, address, reuse_port=False).close()
    try:
        return _bind(family, address, reuse_port=True, reuse_address=False)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return _bind(family, address, reuse_port=True)


def _bind_url(url: PeerUrl, reuse_port: bool) -> Listener:
    infos = socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses: list[tuple[socket.AddressFamily, tuple[Any, ...]]] = []
    sockets: list[socket.socket] = []
    port = url.port  # 0 until the first address is bound, then that port for every address
    try:
        for family, _, _, _, sockaddr in infos:
            address = (sockaddr[0], port, *sockaddr[2:])
            if (family, address) in addresses:
                continue
            if reuse_port:
                sock = _reserve(family, address)
            else:
                sock = _bind(family, address, reuse_port=False)
                sock.listen(BACKLOG)
            sockets.append(sock)
            port = sock.getsockname()[1]
            addresses.append((family, (sockaddr[0], port, *sockaddr[2:])))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return Listener(url.with_port(port), tuple(addresses), tuple(sockets))


def bind_listeners(urls: Sequence[str], *, reuse_port: bool = REUSE_PORT) -> list[Listener]:
    """Bind every address of every URL (port 0 picks one port, shared by all addresses of
    that URL). With ``reuse_port`` the sockets only reserve the port; without, they listen.
    Raises ``OSError`` (the port is taken, the host does not resolve) with nothing left open.
    """
    listeners: list[Listener] = []
    try:
        for url in urls:
            listeners.append(_bind_url(parse_url(url), reuse_port))
    except BaseException:
        close_listeners(listeners)
        raise
    return listeners


def close_listeners(listeners: Sequence[Listener]) -> None:
    for listener in listeners:
        for sock in listener.sockets:
            sock.close()


def worker_sockets(listener: Listener, reuse_port: bool) -> list[socket.socket]:
    """A worker's listening sockets for ``listener``: its own ``SO_REUSEPORT`` ones (the
    parent's reservations closed in the worker), or the parent's, inherited."""
    if not reuse_port:
        return list(listener.sockets)
    for sock in listener.sockets:  # the parent's port reservations
        sock.close()
    sockets = [_bind(family, address, reuse_port=True) for family, address in listener.addresses]
    for sock in sockets:
        sock.listen(BACKLOG)
    return sockets


__all__ = [
    "BACKLOG",
    "REUSE_PORT",
    "Listener",
    "bind_listeners",
    "close_listeners",
    "worker_sockets",
]

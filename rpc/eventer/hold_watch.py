"""Seeing the server go while the Eventer client holds its input.

Past its deliveries' bounds the client stops reading its connection (see
:mod:`rpc.eventer.deliveries`), and a transport whose reading is paused hears nothing of
its socket: asyncio and uvloop call neither ``eof_received`` nor ``connection_lost`` for a
FIN or a reset that arrives meanwhile. Before, the client went on calling itself connected,
and its calls went on waiting (a query's 10-s timeout could run out first), until it read on or
the second of the Pings it sends while holding (every ``ping_timeout / 2``) failed to go
out: up to ``ping_timeout``, 20 s, after the close. Reading to find out is no answer: the
server's FIN comes after the data not read yet, which is what the hold keeps out of memory,
and when that data fills our receive window the FIN does not even leave the server's host.

So while it holds, the client looks at the socket without reading it, every
:data:`CHECK_INTERVAL` s (one ``poll`` call): a reset, a socket error or, on Linux, the
server's FIN (``POLLRDHUP``, whatever unread data comes before it) means the server is
gone, and the connection is aborted (:func:`watch`): the client's state flips, its calls
waiting on the connection fail with ``rpc.ConnectionClosed``, the notifications it had
received are still delivered, and those still unread in the socket (at most its receive
buffer) are dropped with it. A FIN held back by our closed window needs a write of ours to
come out: the next Ping reaches a host whose socket is closed, which answers with a reset,
seen at the next look.

Bound: the close is seen within :data:`CHECK_INTERVAL` (0.5 s) of a FIN or a reset reaching
the client, and otherwise within ``ping_timeout / 2`` (10 s by default) plus a round trip
and that interval. Without ``select.poll`` (Windows) the second Ping's write still tells,
within ``ping_timeout``; without Pings (``ping_interval=None``) only a FIN or reset that
reaches the client is seen. The looks cost one system call per 0.5 s, only while holding.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
from typing import Any

import rpc

CHECK_INTERVAL = 0.5
"""Seconds between two looks at a held connection's socket."""

_POLL = getattr(select, "poll", None)
_RDHUP: int = getattr(select, "POLLRDHUP", 0)
"""Linux's "the peer closed its side" (a FIN received, even behind unread data)."""


def gone(transport: Any) -> BaseException | None:
    """Why the connection of ``transport`` is over, as its socket shows without a read; None
    while it looks open or cannot be looked at (no socket, no ``poll``)."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or _POLL is None:
        return None
    fd = sock.fileno()
    if fd < 0:
        return None
    poller = _POLL()
    poller.register(fd, _RDHUP)  # errors and hang-ups are reported whatever is asked
    ready = poller.poll(0)
    flags = ready[0][1] if ready else 0
    if not flags & (select.POLLERR | select.POLLHUP | _RDHUP):
        return None
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if flags & select.POLLERR else 0
    if code:
        return ConnectionResetError(code, f"{os.strerror(code)} (seen while reading was held)")
    return rpc.ConnectionClosed("the server closed the connection (seen while reading was held)")


async def watch(room: asyncio.Event, peer: rpc.Peer | None) -> bool:
    """Wait for ``room`` while the deliveries hold ``peer``'s input, looking at its socket
    every :data:`CHECK_INTERVAL` s meanwhile; a connection found over is aborted (False)."""
    while not room.is_set():
        try:
            async with asyncio.timeout(CHECK_INTERVAL):
                await room.wait()
        except TimeoutError:
            reason = gone(peer.transport) if peer is not None else None
            if reason is not None and peer is not None:
                peer.abort(reason)
                return False
    return True

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

So while it holds, the event loop watches the socket for the client, unread (:func:`watch`):
an ``epoll`` instance of the watch's own has the socket registered for ``EPOLLRDHUP |
EPOLLERR | EPOLLHUP`` alone (not ``EPOLLIN``: the unread data must not wake it), and the
loop reads the epoll's fd (``loop.add_reader``: an epoll fd is readable while one of its
events is pending; asyncio's selector loop and uvloop alike). Nothing runs until one fires,
no timer. Then:

- the server's FIN (``EPOLLRDHUP``, or ``EPOLLHUP`` with no socket error): the server sends
  nothing after it, so what is left unread is at most what the socket's receive buffer
  holds (``SO_RCVBUF``; Linux grows it up to ``net.ipv4.tcp_rmem``'s maximum: 6 MiB by
  the kernel's default, more where a system sets it), plus what the connection already
  kept. The watch ends with :data:`FIN` and the deliveries hold that connection no more
  (:meth:`~rpc.eventer.deliveries.Deliveries.wait_for_room`): it reads the rest at once,
  the notifications in it are delivered in order, the answers in it reach the calls
  waiting, and the connection ends as any does at the server's close (the client's state
  flips, later calls fail with ``rpc.ConnectionClosed``). Hat's client, which reads on
  once its queue has room, delivers them too: the statuses a graceful close announces
  (``STOPPING``, ``STANDBY``) among them. (dd32f6f and 73d7d0a aborted here, dropping
  them.)
- a reset or a socket error (``EPOLLERR``, or ``EPOLLHUP`` with ``SO_ERROR`` set): the
  connection is aborted (:data:`GONE`): the client's state flips, its calls waiting fail
  with ``rpc.ConnectionClosed``, the notifications it had received are still delivered,
  and what is unread in the socket is dropped with it.

A FIN held back by our closed window needs a write of ours to come out: the next Ping
reaches a host whose socket is closed, which answers with a reset, seen as it arrives.

Bound: the close is seen within one loop iteration of a FIN or a reset reaching the client
(after a FIN, plus the reading of at most the receive buffer), and otherwise within
``ping_timeout / 2`` (10 s by default) plus a round trip (dd32f6f looked every 0.5 s
instead: a timer and a ``poll`` call per look while holding). Cost: one extra fd (the
epoll) per wait for room, so per held connection, only while it holds: taken off the loop
and closed when room comes, when the server's FIN or a reset is seen, and when the wait is
cancelled (the connection closed otherwise, the client closed). The transport's own socket
fd is never given to the loop (its reader there is the transport's). Where
``select.epoll`` is missing (not Linux) nothing watches: the second hold Ping's write still
tells, within ``ping_timeout`` (an abort: what is unread is dropped); without Pings
(``ping_interval=None``) there, only reading on tells.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
from typing import Any, Literal

import rpc

Seen = Literal["room", "fin", "gone"]
"""How a :func:`watch` ended: room came; the server's FIN (read the rest); the connection
aborted (a reset, a socket error)."""
ROOM: Seen = "room"
FIN: Seen = "fin"
GONE: Seen = "gone"

_EPOLL: Any = getattr(select, "epoll", None)
"""``select.epoll`` (Linux), or None: no watch (typed Any: the stubs define it on Linux only)."""
_WATCHED: int = (
    getattr(select, "EPOLLRDHUP", 0)
    | getattr(select, "EPOLLERR", 0)
    | getattr(select, "EPOLLHUP", 0)
)
"""The peer closed its side (a FIN received, even behind unread data), an error, a hang-up."""


async def watch(room: asyncio.Event, peer: rpc.Peer | None) -> Seen:
    """Wait for ``room`` while the deliveries hold ``peer``'s input: :data:`ROOM` once it
    comes. Meanwhile the loop watches the connection's socket, unread (module doc): at the
    server's FIN the watch ends with :data:`FIN` (the caller stops holding: the rest is
    read); at a reset or socket error the connection is aborted and it ends with
    :data:`GONE`. Without a socket to watch or ``select.epoll``, only waits."""
    if room.is_set():
        return ROOM
    transport = peer.transport if peer is not None else None
    sock = transport.get_extra_info("socket") if transport is not None else None
    fd = sock.fileno() if sock is not None else -1
    if _EPOLL is None or peer is None or fd < 0:
        await room.wait()
        return ROOM
    loop = asyncio.get_running_loop()
    seen: asyncio.Future[Seen] = loop.create_future()
    epoll = _EPOLL(1)
    try:
        epoll.register(fd, _WATCHED)
        loop.add_reader(epoll.fileno(), _seen, loop, epoll, sock, peer, seen)
        waiting = asyncio.ensure_future(room.wait())
        try:
            await asyncio.wait((waiting, seen), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            loop.remove_reader(epoll.fileno())
    finally:
        epoll.close()
    return seen.result() if seen.done() else ROOM


def _seen(
    loop: asyncio.AbstractEventLoop,
    epoll: Any,
    sock: Any,
    peer: rpc.Peer,
    seen: asyncio.Future[Seen],
) -> None:
    """The epoll is readable: one of the watched events is pending on the socket. A reset
    or socket error aborts the connection (with its error); the server's FIN alone ends
    the watch (module doc)."""
    ready = epoll.poll(0)
    if not ready or seen.done():
        return
    loop.remove_reader(epoll.fileno())  # level-triggered: it would fire until taken off
    events = ready[0][1]
    failed = events & (select.EPOLLERR | select.EPOLLHUP)
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if failed else 0
    if not code and not events & select.EPOLLERR:
        seen.set_result(FIN)  # nothing comes after it: the rest is read, not dropped
        return
    seen.set_result(GONE)
    if code:
        peer.abort(ConnectionResetError(code, f"{os.strerror(code)} (seen while reading was held)"))
    else:
        peer.abort(rpc.ConnectionClosed("the connection failed (seen while reading was held)"))

"""The parts of the stream requests a connection serves, from the peer to their handlers.

:class:`ServedStreams` is the half of :class:`~rpc.responder.Responder` (mixed into
:class:`~rpc.peer.Peer`, which sets up its state) that takes them: each incoming stream's
queue in ``_streams`` (at most ``max_concurrent`` streams; each queue at most
``max_stream_queue`` parts, past which reading pauses until its handler makes room:
:mod:`rpc.stream_hold`), and the streams ended early in ``_ended`` (the last
:data:`ENDED_STREAMS`), whose late parts are dropped; both freed with the connection.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Generic

from rpc.closing import NOT_CLOSING
from rpc.errors import RemoteError
from rpc.key import K
from rpc.stream_hold import NoRoom, StreamHold
from rpc.streaming import END, StreamQueue

if TYPE_CHECKING:
    import asyncio

    from rpc.options import Adapter, Options
    from rpc.request_bytes import RequestBytes

ENDED_STREAMS = 256
"""Incoming streams remembered after we stopped taking their parts (refused, failed or
answered early), so their late parts are dropped instead of counting as parts of an
unknown stream (a protocol violation for Gotalk). Older ones are forgotten; once a graceful
close began, the parts of any stream we do not know are dropped: it may turn away more
stream requests than this from a peer without retry results, which, told nothing, sends
their parts on."""


class ServedStreams(Generic[K]):
    """The parts of the stream requests the peer makes to us (see the module doc)."""

    adapter: Adapter[K]
    options: Options
    _loop: asyncio.AbstractEventLoop
    _streams: dict[K, StreamQueue]
    _stream_hold: StreamHold
    _request_bytes: RequestBytes
    _ended: OrderedDict[K, None]
    _close_began: float

    def _end_stream(self, key: K) -> None:
        """Stop taking parts of incoming stream ``key``; remember it for a while."""
        queue = self._streams.pop(key, None)
        if queue is not None:
            self._stream_hold.drop(queue)  # its reader takes no more
        ended = self._ended
        ended[key] = None
        if len(ended) > ENDED_STREAMS:
            ended.popitem(last=False)

    def on_request_part(self, key: K, payload: Any) -> bool:
        """Queue a part for its stream's handler. False: no such stream, now or lately.
        Past ``max_stream_queue`` parts unread or ``max_size`` bytes of them, raises
        InputHeld (see :mod:`rpc.stream_hold`): the part waits, and the handler's stream
        fails should it take none within the connection's request timeout. Past
        ``max_request_bytes`` held for the connection's requests, raises NoRoom (an
        InputHeld): the part waits until handlers take or finish enough
        (:mod:`rpc.request_bytes`), and the peer reads on meanwhile."""
        queue = self._streams.get(key)
        if queue is None:  # refused, failed or answered: dropped
            return key in self._ended or self._close_began != NOT_CLOSING
        options = self.options
        if len(queue) >= options.max_stream_queue or queue.bytes >= options.max_size:
            self._stream_hold.hold(queue, lambda: self._stalled_parts(key))
        held = self._request_bytes
        if held.used >= held.limit:
            raise NoRoom
        queue.put(payload)
        return True

    def _stalled_parts(self, key: K, drop: bool = False) -> None:
        """A stream handler took none of its full queue's parts within its stall limit: its
        stream fails alone (the error ends its parts; later parts are dropped). ``drop``:
        its parts are dropped too, for the bytes they hold
        (:class:`~rpc.stream_hold.RoomStall`)."""
        queue = self._streams.get(key)
        if queue is not None:
            self._end_stream(key)
            waiting, stall = len(queue), queue.stall
            if drop:
                queue.drop()
            queue.put(
                RemoteError(f"{waiting} stream request parts waiting, none taken for {stall} s")
            )

    def open_parts(self, key: K) -> StreamQueue:
        """Open the queue of stream request ``key``'s parts: its handler may go the
        connection's request timeout without taking one while it holds
        (:mod:`rpc.stream_hold`)."""
        stall = self.options.timeout
        stall = self.adapter.default_timeout if stall is None else stall
        queue = self._streams[key] = StreamQueue(self._loop, stall, self._request_bytes)
        return queue

    def on_request_end(self, key: K) -> bool:
        """End a stream's parts. False: no such stream, now or lately."""
        queue = self._streams.pop(key, None)
        if queue is None:
            if key not in self._ended:
                return self._close_began != NOT_CLOSING
            del self._ended[key]
            return True
        queue.put(END)
        return True

    def has_stream(self, key: K) -> bool:
        """True while an incoming stream request ``key`` takes parts."""
        return key in self._streams

    def takes_parts(self, key: K) -> bool:
        """True while parts of stream request ``key`` need no slot: its handler takes them,
        or they are dropped (the stream ended lately, e.g. failed for a stall)."""
        return key in self._streams or key in self._ended


async def _parts(queue: StreamQueue, decode: Any) -> AsyncIterator[Any]:
    """The async iterator a stream handler reads its request parts from."""
    while True:
        while not len(queue):
            await queue.wait()
        item = queue.take()
        if item is END:
            return
        if isinstance(item, BaseException):
            raise item
        yield decode(item)

"""The buffer stream connections read into: one per thread, shared by its connections.

asyncio's socket transports read with ``recv`` into a new ``bytes`` of up to 256 KiB per
read, and the TLS layers of asyncio and uvloop decrypt into one. glibc serves a block that
large with ``mmap`` (in about half the processes measured here: unless an earlier free has
raised its threshold), and the shrink to the bytes read and the free cost two more system
calls: about 8-10 us per read, more than the core spends on a small request. An
:class:`asyncio.BufferedProtocol` is given no new object: the transport reads (or decrypts)
into the buffer the protocol provides. (uvloop's plain TCP reads already go through a
buffer of the loop's; there this costs two Python calls per read and saves nothing.)
:class:`SharedBufferProtocol` (the RPC core's peers, the WebSocket connection, the group
node's inbound connections) provides this one and copies what was read out of it at once,
so every connection of a thread can share it: a read fills it and is handed over before the
loop does anything else, and a thread runs one loop at a time. Memory: :data:`READ_SIZE`
bytes per thread that reads, none per connection.
"""

from __future__ import annotations

import abc
import asyncio
import threading

READ_SIZE = 256 * 1024
"""Bytes one read may take (asyncio's own largest read)."""

_local = threading.local()


def read_buffer() -> memoryview:
    """This thread's buffer (made at its first read)."""
    try:
        view: memoryview = _local.view
    except AttributeError:
        view = _local.view = memoryview(bytearray(READ_SIZE))
    return view


def take(nbytes: int) -> bytes:
    """The first ``nbytes`` of this thread's buffer, copied out (the read just made)."""
    return read_buffer()[:nbytes].tobytes()


class SharedBufferProtocol(asyncio.BufferedProtocol, metaclass=abc.ABCMeta):
    """A stream protocol that reads through this thread's buffer and takes the bytes read in
    :meth:`data_received`, as a plain ``asyncio.Protocol`` would (which also lets a
    transport that has bytes already, such as a WebSocket message, hand them over)."""

    __slots__ = ()

    def get_buffer(self, sizehint: int) -> memoryview:
        return read_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(take(nbytes))

    @abc.abstractmethod
    def data_received(self, data: bytes) -> None:
        """Bytes from the other side."""

"""What one connection knows of request metadata, whichever protocol carries it.

peerwire's extension (levels 2 and 3, :mod:`wire.metadata`) sends a request's metadata in a
message of its own right before it, or (level 3) a connection-wide default for the requests
that come without any. Each adapter encodes and decodes those messages for its protocol;
:class:`MetaState` keeps what they mean, both ways: the metadata the peer sent for its
next request, the default it announced, and the default we announced. Bounds:
:data:`MAX_PENDING` metadata records waiting for their requests, taking at most
:data:`MAX_PENDING_BYTES` and one record more (the oldest go first), and two defaults per
connection, freed with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic

from rpc.key import K
from rpc.logs import violations
from rpc.request_bytes import text_size
from wire.errors import ProtocolError
from wire.metadata import RequestMeta, covers, default_for

MAX_PENDING = 16
"""Metadata records a connection keeps for requests still to come (see
:attr:`MetaState.pending`)."""
MAX_PENDING_BYTES = 1 << 20
"""Bytes those records may take together (:func:`record_size`), the newest one aside: past
it the oldest go first. One record may take about 8 MiB (32 entries of a 64 KiB value, at
4 bytes a character in memory when not ASCII), so a connection holds at most this and
one such record."""
RECORD_BYTES = 64
"""What a record counts besides its entries (its key, time and tuple)."""


def record_size(meta: RequestMeta) -> int:
    """The bytes a waiting record counts: :data:`RECORD_BYTES` and its entries' names and
    values as :func:`rpc.request_bytes.text_size` counts them (their memory, at least)."""
    entries = meta.entries
    if not entries:
        return RECORD_BYTES
    return RECORD_BYTES + sum(text_size(k) + text_size(v) for k, v in entries.items())


class MetaState(Generic[K]):
    """One connection's request metadata state (see the module doc)."""

    __slots__ = ("default", "pending", "pending_bytes", "sent_default")

    def __init__(self) -> None:
        self.pending: dict[K, tuple[RequestMeta, float, int]] = {}
        """The metadata the peer sent for requests still to come, by their keys: (the
        metadata, the loop time it was read at, its :func:`record_size`, counted once),
        oldest first; each taken by its request.
        Usually one, right before its request. More wait when a graceful close takes
        metadata at once while requests read before it are still kept for a slot, and a
        record whose request never ran (turned away, or never sent) waits until newer ones
        push it out (past :data:`MAX_PENDING` records or :data:`MAX_PENDING_BYTES`): it
        goes to no other request."""
        self.pending_bytes = 0
        """What the records of :attr:`pending` count (:func:`record_size`)."""
        self.default: RequestMeta | None = None
        """The peer's announced default (level 3) as the metadata of its requests that come
        without their own; None: it announced none (or no timeout)."""
        self.sent_default: int | None = None
        """The default we announced (ms; None: none, as at the start)."""

    def clear(self) -> None:
        """The connection is gone: no record waits for a request any more."""
        self.pending = {}
        self.pending_bytes = 0

    def received(self, key: K, meta: RequestMeta, read_at: float) -> None:
        """The peer sent ``meta`` for its request ``key`` (read at loop time ``read_at``)."""
        pending = self.pending
        again = pending.pop(key, None)  # sent again: the latest, and the newest in the order
        if again is not None:
            self.pending_bytes -= again[2]
        size = record_size(meta)
        pending[key] = (meta, read_at, size)
        self.pending_bytes += size
        while len(pending) > 1 and (
            len(pending) > MAX_PENDING or self.pending_bytes > MAX_PENDING_BYTES
        ):
            self.pending_bytes -= pending.pop(next(iter(pending)))[2]

    def received_default(self, timeout_ms: int | None) -> None:
        """The peer announced the time left of its requests without metadata from now on."""
        self.default = None if timeout_ms is None else RequestMeta(timeout_ms)

    def receive(
        self, decode: Callable[[bytes], tuple[K, RequestMeta]], data: bytes, peer: Any
    ) -> None:
        """The peer's metadata message ``data`` (read in ``peer``'s current read), decoded
        by its protocol's ``decode``; one that does not decode is a violation, logged, and
        changes nothing."""
        try:
            key, meta = decode(data)
        except ProtocolError as exc:
            violations.warning("%s peer %s: %s", peer.protocol_name, peer.remote_address, exc)
            return
        self.received(key, meta, peer.read_at)

    def receive_default(
        self, decode: Callable[[bytes], int | None], data: bytes, peer: Any
    ) -> None:
        """The peer's default-timeout message ``data``, as :meth:`receive` takes metadata."""
        try:
            self.received_default(decode(data))
        except ProtocolError as exc:
            violations.warning("%s peer %s: %s", peer.protocol_name, peer.remote_address, exc)

    def take(self, key: K, read_at: float) -> tuple[RequestMeta, float] | None:
        """The metadata of the peer's request ``key``, which arrived in a read at loop time
        ``read_at``, and the time it counts from: what the peer sent for it, else the
        default; None: neither. Metadata sent for other requests stays for them (see
        :attr:`pending`)."""
        pending = self.pending
        if pending:
            taken = pending.pop(key, None)
            if taken is not None:
                self.pending_bytes -= taken[2]
                return taken[0], taken[1]
        if self.default is not None:
            return self.default, read_at
        return None

    def cover(self, left_ms: int | None) -> bool:
        """Make the default we announce cover a request of ours with ``left_ms`` left (None:
        no timeout) that goes without metadata: True when that takes a new announcement,
        whose default (:func:`wire.metadata.default_for`) :attr:`sent_default` then is."""
        if covers(self.sent_default, left_ms):
            return False
        self.sent_default = default_for(left_ms)
        return True

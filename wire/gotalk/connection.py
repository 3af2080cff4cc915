"""The framing state of one Gotalk v1 connection (either side)."""

from __future__ import annotations

from wire import DEFAULT_MAX_SIZE
from wire.errors import ProtocolError, UnsupportedVersion
from wire.gotalk.decoding import PARSERS, unknown_type
from wire.gotalk.encoding import encode, encode_parts
from wire.gotalk.messages import VERSION, ErrorCode, Fault, Message


class GotalkConnection:
    """Framing state of one Gotalk connection, either side (client and server are alike).

    Feed received bytes to :meth:`receive_data`; turn messages into bytes with :meth:`send`.
    The first two bytes received are the peer's version; only ``01`` is accepted.

    Memory: at most one incomplete message is buffered, and a payload size above
    ``max_size`` is rejected from its header, before any of the payload is buffered, so the
    buffer never exceeds the header (at most 4111 bytes) plus ``max_size``.

    After :meth:`receive_data` raises, the connection is dead: every later call raises the
    same exception again (the caller should send :meth:`fault` with ``exc.code`` where the
    peer expects one, then close). Messages parsed earlier in the chunk that failed are
    dropped with it, since the connection is being closed anyway.
    """

    __slots__ = ("_buf", "_error", "_max_size", "_need", "_peer_version")

    def __init__(self, *, max_size: int = DEFAULT_MAX_SIZE) -> None:
        if max_size < 0:
            raise ValueError("max_size must be >= 0")
        self._max_size = max_size
        self._buf = bytearray()  # the version, or one incomplete message
        self._need = len(VERSION)  # length _buf must reach before it is parsed again
        self._peer_version: bytes | None = None
        self._error: ProtocolError | None = None

    @property
    def peer_version(self) -> bytes | None:
        """The version the peer sent (``b"01"``), or None until it has arrived."""
        return self._peer_version

    @property
    def max_size(self) -> int:
        """Largest payload accepted from the peer."""
        return self._max_size

    @property
    def buffered(self) -> int:
        """Bytes held back as an incomplete message (the core bounds how long it may take)."""
        return len(self._buf)

    @property
    def missing(self) -> int:
        """Bytes the input must still bring to complete what is held in part (the version or
        a message; 0: nothing is): a lower bound while a message's header is incomplete, its
        size unknown. A reader that decodes a large read in slices cuts them past it."""
        return self._need - len(self._buf) if self._buf else 0

    @property
    def error(self) -> ProtocolError | None:
        """The error that killed the connection, or None while it is alive."""
        return self._error

    def forget(self) -> None:
        """Drop a message that had not fully arrived (up to ``max_size``), for when the
        connection is over: its owner may outlive it (until a cyclic collection, for
        instance); the bytes need not."""
        self._buf = bytearray()

    def handshake(self) -> bytes:
        """Bytes to send first: our version. It may share one write with the first message."""
        return VERSION

    def send(self, message: Message) -> bytes:
        """The bytes of ``message`` (see :func:`encode`)."""
        return encode(message)

    def send_parts(self, message: Message) -> tuple[bytes, bytes]:
        """``(header, payload)`` of ``message``: one WebSocket frame each (:func:`encode_parts`)."""
        return encode_parts(message)

    def fault(self, code: ErrorCode | int) -> bytes:
        """The bytes of an ``f`` message, to send just before closing the connection."""
        return encode(Fault(code))

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Message]:
        """Parse ``data`` (any chunking) and return every message it completes, in order.

        Raises :class:`UnsupportedVersion` (code 1) for a version other than ``01``,
        :class:`MalformedMessage` (code 2) for an unknown type, non-hex digits or a name
        that is not UTF-8, and :class:`MessageTooLarge` (code 2) for a payload size above
        ``max_size``. A partial message just waits for more bytes. Once it has raised, the
        connection is dead and every later call raises the same error again.
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        out: list[Message] = []
        pos = 0
        try:
            if self._buf or self._peer_version is None:
                pos = self._resume(data, out)  # (from a view too: it copies what it takes)
            if data.__class__ is not bytes:  # the parsers read bytes: what is left, copied
                data = bytes(memoryview(data)[pos:])  # once (the rest of a large message
                pos = 0  # given as a view is not copied twice)
            end = len(data)
            parsers = PARSERS
            max_size = self._max_size
            while pos < end:
                parser = parsers[data[pos]]
                if parser is None:
                    raise unknown_type(data[pos])
                message, stop = parser(data, pos, end, max_size)
                if message is None:
                    self._buf += memoryview(data)[pos:]
                    self._need = stop - pos
                    break
                out.append(message)
                pos = stop
        except ProtocolError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        return out

    def _resume(self, data: bytes | bytearray | memoryview, out: list[Message]) -> int:
        """Complete the version or the buffered message from ``data``; return bytes used.

        Only what the pending item needs is copied into the buffer, so the buffer never
        holds more than one message, however large ``data`` is.
        """
        buf = self._buf
        pos = 0
        while True:
            take = self._need - len(buf)
            if take > 0:
                chunk = memoryview(data)[pos : pos + take]
                buf += chunk
                pos += len(chunk)
            if self._peer_version is None:
                if not VERSION.startswith(buf):
                    raise UnsupportedVersion(
                        f"unsupported protocol version {bytes(buf)!r}",
                        code=ErrorCode.UNSUPPORTED_PROTOCOL,
                    )
                if len(buf) < self._need:
                    return pos
                self._peer_version = VERSION
                self._buf = bytearray()
                return pos
            if len(buf) < self._need:
                return pos
            raw = bytes(buf)
            parser = PARSERS[raw[0]]
            if parser is None:  # receive_data buffers only messages of a known type
                raise unknown_type(raw[0])
            message, stop = parser(raw, 0, len(raw), self._max_size)
            if message is None:
                self._need = stop
                continue
            out.append(message)
            self._buf = bytearray()
            return pos

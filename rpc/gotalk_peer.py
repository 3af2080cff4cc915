"""The RPC core over Gotalk v1: requests are ``r``/``s``+``p``, results ``R``/``S``/``E``/``e``.

Request ids are 4 opaque bytes; ours are a little-endian counter (as the Go client's).
Liveness: we send a heartbeat every ``heartbeat_interval`` seconds (default 20 s) and, when
nothing at all arrives for ``read_timeout`` seconds (default 30 s; none over WebSocket), send
``f00000003`` and close, as Go peers do (:mod:`rpc.gotalk_liveness`).

Compatibility with real peers:
- a stream request (``s``) is always answered with stream results, ending with an empty
  ``S``, even when the handler returns one value: gotalk.js 1.2.1's ``streamRequest``
  waits for that end.
- retry results (``e``) go only to peers that understand them: byte-stream peers (Go,
  peerwire) and WebSocket peers whose transport says so (``peerwire_retry`` extra info).
  gotalk.js 1.2.1 answers ``e`` with ``f00000002`` and drops the connection, so other
  WebSocket peers' requests past ``max_concurrent`` wait until a handler ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rpc import intercept
from rpc.errors import retry_wait_ms
from rpc.gotalk_liveness import GotalkLiveness
from rpc.message_stall import MessageStall
from rpc.payload import decode_any, encode_value
from rpc.peer import Options, Peer
from rpc.registry import Handler, Registry
from rpc.request_bytes import text_size
from rpc.request_meta import MetaState
from wire import gotalk, metadata
from wire.errors import ProtocolError

_R, _S, _E, _P = (
    gotalk.MessageType.RESULT,
    gotalk.MessageType.STREAM_RESULT,
    gotalk.MessageType.ERROR_RESULT,
    gotalk.MessageType.STREAM_REQUEST_PART,
)
_REQ, _SREQ = gotalk.MessageType.REQUEST, gotalk.MessageType.STREAM_REQUEST
_id_header = gotalk.id_header
_RESULT_FORMAT = gotalk.id_format(_R)
"""An ``R`` header's format, for the reply path: ``_id_header(_R, ...)`` written out."""
_MAX_PAYLOAD = gotalk.MAX_PAYLOAD_SIZE
REQUEST_FORMATS = 64
"""Operations whose request header format a connection keeps (see
:func:`wire.gotalk.request_format`); past that many it starts again from none."""

HELLO = "peerwire/hello"
"""Extension announcement: a client sends it after the version, its payload the level it
speaks (ASCII digits: 1 cancellation, 2 also request metadata, 3 also a default timeout);
a peerwire server answers
with the level both speak, and from then on both sides use that level. Go and gotalk.js
peers ignore notifications they have no handler for, and a server never sends it first,
so they never see anything else of the extension."""
CANCEL = "peerwire/cancel"
"""The caller gave up on the request whose 4-byte id is the payload."""
META = "peerwire/meta"
"""Level 2: the metadata of the request sent right after it (:mod:`wire.metadata`)."""
TIMEOUT = "peerwire/timeout"
"""Level 3: the time left of the requests that follow without metadata, until the next one
(:mod:`wire.metadata`)."""
_META_HEADER = gotalk.encode_parts(gotalk.Notification(META, b""))[0][:-8] + b"%08x"
"""The header of a ``peerwire/meta`` notification, its payload size left to fill in: one is
sent before every request that carries metadata."""
_TIMEOUT_HEADER = gotalk.encode_parts(gotalk.Notification(TIMEOUT, bytes(4)))[0]
"""The header of a ``peerwire/timeout`` notification (its payload is always 4 bytes)."""
_EXTENSION_PREFIX = "peerwire/"
_REPLIES = frozenset((gotalk.Result, gotalk.StreamResult, gotalk.ErrorResult, gotalk.RetryResult))
_OPENERS = frozenset((gotalk.Request, gotalk.StreamRequest))
LEVEL = 3
"""The extension level we speak."""
_LEVEL = str(LEVEL).encode()


class GotalkAdapter:
    """Maps the peer's events onto Gotalk messages and back (see the module doc)."""

    name = "gotalk"
    default_timeout = 30.0

    def __init__(
        self,
        peer: Peer[bytes],
        *,
        heartbeat_interval: float | None,
        read_timeout: float | None,
        retry_results: bool | None,
        extensions: bool,
    ) -> None:
        self.peer = peer
        self.extensions = extensions
        self.cancels = False
        self.metadata = False
        """True once both sides speak extension level 2 (request metadata)."""
        self.timeout_defaults = False
        """True once both sides speak extension level 3 (a default timeout)."""
        self.meta: MetaState[bytes] = MetaState()
        self.codec = gotalk.GotalkConnection(max_size=peer.options.max_size)
        self.retry_results = retry_results if retry_results is not None else True
        self._retry_choice = retry_results
        self._next_id = 0
        """Requests sent so far (it keeps counting past 2**32; an id is its low 32 bits)."""
        self._request_formats: dict[str, bytes] = {}
        """Request header formats by operation: a caller sends the same few again and
        again, and a format kept saves two calls per request (at most
        :data:`REQUEST_FORMATS`)."""
        self._framed = False
        self.liveness = GotalkLiveness(
            peer, heartbeat_interval, read_timeout, self._emit_header, self.codec.fault
        )
        """Heartbeats and the read check (:mod:`rpc.gotalk_liveness`)."""
        self.stall = MessageStall(peer, lambda: self.codec.fault(gotalk.ErrorCode.TIMEOUT))
        """The least rate of an unfinished message (:mod:`rpc.message_stall`)."""

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        peer = self.peer
        self._framed = peer.outbox.framed
        if self._framed and self._retry_choice is None:
            transport = peer.transport
            self.retry_results = bool(transport.get_extra_info("peerwire_retry", False))
        peer.outbox.push(self.codec.handshake())
        if self.extensions:
            self._emit_header(*gotalk.encode_parts(gotalk.Notification(HELLO, _LEVEL)))
        self.liveness.start(self._framed)
        self.stall.start()

    def stop(self) -> None:
        """What the connection held goes now, not with a cyclic collection of the peer
        (which lives in reference cycles): a part-read message (up to ``max_size``) and
        metadata waiting for its request. Timers live in the peer's deadlines."""
        self.codec.forget()
        self.meta.clear()

    def handshake_pending(self) -> bool:
        return self.codec.peer_version is None

    def input_held(self) -> None:
        """Nothing to do: our heartbeats go out on their own plan, read or not."""

    def last_word(self, exc: ProtocolError) -> None:
        code = exc.code if exc.code is not None else gotalk.ErrorCode.INVALID_MESSAGE
        self.peer.outbox.push(self.codec.fault(code))

    # --- receiving -------------------------------------------------------------------------

    @property
    def missing(self) -> int:
        return self.codec.missing

    def decode(self, data: bytes | memoryview, read_at: float) -> list[Any]:
        self.liveness.last_read = read_at
        codec = self.codec
        messages = codec.receive_data(data)
        self.stall.read(read_at, len(data), codec.buffered)
        return messages

    def is_reply(self, msg: Any) -> bool:
        return msg.__class__ in _REPLIES

    def serves_running(self, msg: Any) -> bool:
        if msg.__class__ is gotalk.StreamRequestPart:
            return self.peer.takes_parts(msg.id)
        cancelled = self.follows_request(msg)  # a cancellation
        return cancelled is not None and self.peer.cancellable(cancelled)

    def feeds_stream(self, msg: Any) -> bool:
        return msg.__class__ is gotalk.StreamRequestPart and self.peer.has_stream(msg.id)

    def opens_request(self, msg: Any) -> bytes | None:
        cls = msg.__class__  # (an id repeated in flight: the peer errs, and pays for it)
        return msg.id if cls is gotalk.Request or cls is gotalk.StreamRequest else None

    def is_part(self, msg: Any) -> bool:
        return msg.__class__ is gotalk.StreamRequestPart

    def follows_request(self, msg: Any) -> bytes | None:
        cls = msg.__class__
        key: bytes | None = None
        if cls is gotalk.StreamRequestPart:
            key = msg.id
        elif cls is gotalk.Notification and msg.name == CANCEL and self.cancels:
            key = msg.payload if len(msg.payload) == 4 else None
        return key

    def message_size(self, msg: Any) -> int:
        cls = msg.__class__  # its payload, and a request's op or a notification's name
        if cls is gotalk.Heartbeat or cls is gotalk.Fault:
            return 0
        name = msg.op if cls in _OPENERS else msg.name if cls is gotalk.Notification else ""
        return text_size(name) + len(msg.payload)

    def dispatch(self, msg: Any) -> None:
        peer = self.peer
        cls = msg.__class__
        if cls is gotalk.Request:
            meta = self.meta
            if not meta.pending and meta.default is None:
                peer.on_request(msg.id, msg.op, msg.payload, False)
            else:
                intercept.request_with_meta(peer, meta, msg.id, msg.id, msg.op, msg.payload, False)
        elif cls is gotalk.Result:
            peer.on_result(msg.id, msg.payload)
        elif cls is gotalk.StreamRequestPart:
            known = (
                peer.on_request_part(msg.id, msg.payload)
                if msg.payload
                else peer.on_request_end(msg.id)
            )
            if not known:  # as Go peers do
                raise ProtocolError(
                    "stream part for an unknown stream", code=gotalk.ErrorCode.INVALID_MESSAGE
                )
        elif cls is gotalk.StreamResult:
            if msg.payload:
                peer.on_result_part(msg.id, msg.payload)
            else:
                peer.on_result_end(msg.id)
        elif cls is gotalk.Notification:
            if msg.name.startswith(_EXTENSION_PREFIX):
                self._on_extension(msg.name, msg.payload)
            else:
                peer.on_notification(msg.name, msg.payload)
        elif cls is gotalk.ErrorResult:
            peer.on_error(msg.id, msg.payload.decode(errors="replace"))
        elif cls is gotalk.RetryResult:
            peer.on_retry(msg.id, msg.wait / 1000, msg.payload.decode(errors="replace"))
        elif cls is gotalk.StreamRequest:
            if peer.has_stream(msg.id):
                raise ProtocolError(
                    "duplicate in-flight stream id", code=gotalk.ErrorCode.INVALID_MESSAGE
                )
            meta = self.meta
            if not meta.pending and meta.default is None:
                peer.on_request(msg.id, msg.op, msg.payload, True)
            else:
                intercept.request_with_meta(peer, meta, msg.id, msg.id, msg.op, msg.payload, True)
        elif cls is gotalk.Heartbeat:
            self.liveness.heard()
        elif cls is gotalk.Fault:
            peer.abort()

    def _on_extension(self, name: str, payload: bytes) -> None:
        if name == HELLO:
            if self.cancels:
                return  # taken once per connection: a repeated one changes nothing
            spoken = int(payload) if payload.isdigit() and len(payload) <= 9 else 1
            level = min(max(spoken, 1), LEVEL)
            if not self.extensions:  # a server: answer with the level both speak
                answer = str(level).encode()
                self._emit_header(*gotalk.encode_parts(gotalk.Notification(HELLO, answer)))
            self.cancels = True
            self.metadata = level >= 2
            self.timeout_defaults = level >= 3
        elif name == CANCEL and self.cancels and len(payload) == 4:
            self.peer.on_cancel(payload)
        elif name == META and self.metadata:
            self.meta.receive(metadata.decode_gotalk, payload, self.peer)
        elif name == TIMEOUT and self.timeout_defaults:
            self.meta.receive_default(metadata.decode_timeout_gotalk, payload, self.peer)

    # --- sending ---------------------------------------------------------------------------

    def _emit_header(self, header: bytes, payload: bytes) -> None:
        """Queue one message; over WebSocket its header and payload go in separate frames
        (written out for byte streams in :meth:`send_request`)."""
        push = self.peer.outbox.push
        if self._framed:
            push(header)
            if payload:
                push(payload)
        else:
            push(header + payload if payload else header)

    def _new_id(self) -> bytes:
        """A request id none of our calls in flight holds: the count from 1 up, which cannot
        clash until it passes 2**32 (written out in :meth:`_write_request`)."""
        self._next_id = count = self._next_id + 1
        return count.to_bytes(4, "little") if count <= 0xFFFFFFFF else self._free_id(count)

    def _free_id(self, count: int) -> bytes:
        """Past 2**32 requests: the count's low 32 bits, each id skipped (and counted)
        while a call of ours still holds it."""
        has_call = self.peer.has_call
        while has_call(rid := (count & 0xFFFFFFFF).to_bytes(4, "little")):
            self._next_id = count = count + 1
        return rid

    def send_request(self, op: str, payload: bytes, stream: bool) -> bytes:
        if self.meta.sent_default is not None and self.meta.cover(None):
            self._announce()  # it goes without a timeout: say so first
        return self._write_request(op, payload, stream)

    def _write_request(self, op: str, payload: bytes, stream: bool) -> bytes:
        self._next_id = count = self._next_id + 1  # _new_id written out
        rid = count.to_bytes(4, "little") if count <= 0xFFFFFFFF else self._free_id(count)
        size = len(payload)
        form = None if stream else self._request_formats.get(op)
        if form is None or size > _MAX_PAYLOAD:
            header = self._first_header(op, rid, size, stream)
        else:
            header = form % (rid, size)
        if self._framed:
            self._emit_header(header, payload)
        else:  # _emit_header written out for byte streams: a call per request
            self.peer.outbox.push(header + payload if payload else header)
        return rid

    def _first_header(self, op: str, rid: bytes, size: int, stream: bool) -> bytes:
        """A request header made and checked by the codec (which raises for a name or a
        size that does not fit); a request's format is then kept for ``op``."""
        if stream:
            return gotalk.request_header(_SREQ, rid, op, size)
        header = gotalk.request_header(_REQ, rid, op, size)
        formats = self._request_formats
        if len(formats) >= REQUEST_FORMATS:
            formats.clear()
        formats[op] = gotalk.request_format(_REQ, op)
        return header

    def send_request_meta(
        self,
        op: str,
        payload: bytes,
        stream: bool,
        entries: Mapping[str, str],
        timeout: float | None,
    ) -> bytes:
        """:meth:`send_request` preceded by its metadata (``entries``, and ``timeout``, the
        seconds the caller has left); ValueError for entries past :mod:`wire.metadata`'s
        limits. Only once :attr:`metadata` is on. At level 3 a request with a timeout alone
        goes without metadata under the default announced for it (once per timeout)."""
        ms = None if timeout is None else metadata.timeout_ms(timeout)
        if not entries and self.timeout_defaults:
            if self.meta.cover(ms):
                self._announce()
            return self._write_request(op, payload, stream)
        rid = self._new_id()
        data = metadata.encode_gotalk(rid, metadata.RequestMeta(ms, entries))
        self._emit_header(_META_HEADER % len(data), data)
        kind = _SREQ if stream else _REQ
        self._emit_header(gotalk.request_header(kind, rid, op, len(payload)), payload)
        return rid

    def _announce(self) -> None:
        """Tell the peer the time left of the requests we send without metadata from now on
        (the default :meth:`MetaState.cover` chose)."""
        payload = metadata.encode_timeout_gotalk(self.meta.sent_default)
        self._emit_header(_TIMEOUT_HEADER, payload)

    def send_request_part(self, key: bytes, payload: bytes) -> None:
        if payload:
            self._emit_header(_id_header(_P, key, len(payload)), payload)

    def send_request_end(self, key: bytes) -> None:
        self._emit_header(_id_header(_P, key, 0), b"")

    def send_result(self, key: bytes, payload: bytes, stream: bool) -> None:
        if stream:  # as Go servers answer stream requests: S parts, then an empty S
            if payload:
                self._emit_header(_id_header(_S, key, len(payload)), payload)
            self._emit_header(_id_header(_S, key, 0), b"")
        else:  # _emit_header(_id_header(_R, ...)) written out: two calls less per reply
            size = len(payload)
            if size > _MAX_PAYLOAD or len(key) != 4:
                header = _id_header(_R, key, size)  # raises LocalProtocolError
            else:
                header = _RESULT_FORMAT % (key, size)
            if self._framed:
                self._emit_header(header, payload)
            else:
                self.peer.outbox.push(header + payload if payload else header)

    def send_result_part(self, key: bytes, payload: bytes) -> None:
        if payload:
            self._emit_header(_id_header(_S, key, len(payload)), payload)

    def send_result_end(self, key: bytes, failed: bool) -> None:
        self._emit_header(_id_header(_S, key, 0), b"")

    def send_error(self, key: bytes, message: str) -> None:
        data = message.encode()
        self._emit_header(_id_header(_E, key, len(data)), data)

    def drop_request(self, key: bytes) -> None:
        """Nothing is kept for a Gotalk request but by the responder."""

    def send_retry(self, key: bytes, wait: float, message: str) -> None:
        retry = gotalk.RetryResult(key, retry_wait_ms(wait), message.encode())
        self._emit_header(*gotalk.encode_parts(retry))

    def send_notification(self, name: str, payload: bytes) -> None:
        self._emit_header(*gotalk.encode_parts(gotalk.Notification(name, payload)))

    def abandon(self, key: bytes) -> None:
        """We gave up on request ``key``: a late result is ignored; a peerwire peer is told
        so (the cancellation extension) and cancels the handler."""
        if self.cancels and self.peer.is_open:
            self._emit_header(*gotalk.encode_parts(gotalk.Notification(CANCEL, key)))

    # --- payloads --------------------------------------------------------------------------

    def encode_request(self, op: str, value: Any) -> bytes:
        return encode_value(value)

    def encode_result(self, value: Any) -> bytes:
        return encode_value(value)

    def decode_params(self, handler: Handler, payload: bytes) -> Any:
        return handler.decode(payload)

    def decode_result(self, payload: bytes) -> Any:
        return decode_any(payload)


class GotalkPeer(Peer[bytes]):
    """A :class:`~rpc.peer.Peer` speaking Gotalk v1 (see the module doc for the defaults).

    ``extensions=True`` (what :func:`rpc.connect` sets) announces peerwire's extensions to
    the server; once it answers, a request we give up on (timeout, cancellation) cancels its
    handler there, and requests carry their metadata (trace context, a chosen timeout).
    ``retry_results`` None decides from the transport (see the module doc).
    """

    def __init__(
        self,
        registry: Registry | None = None,
        options: Options | None = None,
        *,
        heartbeat_interval: float | None = 20.0,
        read_timeout: float | None = 30.0,
        retry_results: bool | None = None,
        extensions: bool = False,
    ) -> None:
        super().__init__(
            lambda peer: GotalkAdapter(
                peer,
                heartbeat_interval=heartbeat_interval,
                read_timeout=read_timeout,
                retry_results=retry_results,
                extensions=extensions,
            ),
            registry,
            options,
        )

    @property
    def codec(self) -> gotalk.GotalkConnection:
        return self.gotalk.codec

    @property
    def gotalk(self) -> GotalkAdapter:
        adapter = self.adapter
        if not isinstance(adapter, GotalkAdapter):
            raise TypeError("not a Gotalk peer")
        return adapter

    @property
    def heartbeats_received(self) -> int:
        return self.gotalk.liveness.heartbeats_received

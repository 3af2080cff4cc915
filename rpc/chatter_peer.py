"""The RPC core over Hat Chatter: how requests, results and streams map onto conversations.

=====================  =====================================================================
request                a new conversation: ``type = op``, token passed, ``last = False``
result                 the reply that ends it (``last = True``); ``PeerwireRpc.Result`` for
                       JSON/raw results, or any type the handler names with :class:`Reply`
error / retry result   ``PeerwireRpc.Error`` (String) / ``PeerwireRpc.Retry`` (waitMs,
                       message), ``last = True``
notification           a one-message conversation (``last = True``)
stream request         first message ``type = op`` keeping the token, then
                       ``PeerwireRpc.Part`` messages, then ``PeerwireRpc.End`` passing it
stream result          ``PeerwireRpc.Part`` messages keeping the token, then
                       ``PeerwireRpc.End`` with ``last = True``
=====================  =====================================================================

Legacy peers (hat-chatter 0.5) decode every payload against their own schemas and drop the
connection on a type they do not know. So in the legacy dialect, a request whose type has a
module other than ``PeerwireRpc`` (a plain Hat peer's request) is never answered with a
``PeerwireRpc`` type: a handler's :class:`Reply` goes out as given, a plain result, an
error or a retry ends nowhere (logged; the peer's own conversation timeout ends it).

A handler is keyed by the message type (legacy dialect: ``module.type``), so a plain Hat
peer that sends a message in a new conversation and waits for the reply calls our handlers,
and our ``request`` calls a plain Hat service (any reply that ends the conversation is its
result). Payloads are SBS when the type is in the schema repository, bytes otherwise (JSON
for non-bytes values). Pings and the silence limits: :mod:`rpc.chatter_pings`; when our
replies may go, and as what: :mod:`rpc.chatter_replies`; our requests, notifications and
cancellations as messages: :mod:`rpc.chatter_sending`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rpc import intercept
from rpc.chatter_extension import ChatterHandshake
from rpc.chatter_payloads import Incoming, SbsPayloads, Undecodable
from rpc.chatter_pings import ChatterPings
from rpc.chatter_replies import END, ERROR, PART, RESULT, RETRY, RPC_MODULE, ChatterReplies
from rpc.chatter_sending import CANCEL as _CANCEL
from rpc.chatter_sending import META as _META
from rpc.chatter_sending import TIMEOUT as _TIMEOUT
from rpc.chatter_sending import ChatterSender
from rpc.logs import violations
from rpc.message_stall import MessageStall
from rpc.peer import Options, Peer
from rpc.registry import Registry
from rpc.request_bytes import text_size
from rpc.request_meta import MetaState
from wire import metadata, schemas
from wire.chatter import ChatterConnection, Conversation, Dialect, Msg
from wire.errors import ProtocolError

if TYPE_CHECKING:
    import hat.sbs

log = logging.getLogger("peerwire.rpc.chatter")

_new = tuple.__new__
"""Builds a :class:`Conversation` as its own classmethods do (see wire.chatter.conversations):
one per message received."""


class ChatterAdapter:
    """Maps the peer's events onto Chatter conversations and back (see the module doc)."""

    __slots__ = (
        "_foreign",
        "_last_ping",
        "_on_result",
        "_sbs_names",
        "_token_back",
        "_waits",
        "abandon",
        "cancels",
        "codec",
        "decode_params",
        "decode_result",
        "drop_request",
        "encode_request",
        "encode_result",
        "extensions",
        "handshake",
        "meta",
        "metadata",
        "payloads",
        "peer",
        "pings",
        "replies",
        "retry_results",
        "sbs_repo",
        "send_error",
        "send_notification",
        "send_request",
        "send_request_end",
        "send_request_meta",
        "send_request_part",
        "send_result",
        "send_result_end",
        "send_result_part",
        "send_retry",
        "sender",
        "stall",
        "timeout_defaults",
    )

    name = "chatter"
    default_timeout = 5.0  # the Chatter conversation timeout

    def __init__(
        self,
        peer: Peer[Conversation],
        *,
        dialect: Dialect | None,
        ping_interval: float | None,
        ping_timeout: float,
        strict: bool,
        sbs_repo: hat.sbs.Repository | None,
        extensions: bool,
        retry_results: bool,
    ) -> None:
        self.peer = peer
        self.extensions = extensions
        self.retry_results = retry_results
        """Requests past ``max_concurrent`` get ``PeerwireRpc.Retry``; else they wait. Off
        from a plain Hat peer's first request on (legacy dialect, a module other than
        ``PeerwireRpc``): it cannot decode them, and would hear nothing
        (:mod:`rpc.chatter_replies`)."""
        self.handshake = ChatterHandshake()
        """The extension level and how it was agreed (:mod:`rpc.chatter_extension`)."""
        self.cancels = False
        """True once both sides speak extension level 1 (cancellation); this flag and the
        next two are the handshake's level as the per-request paths read it, ours and the
        sender's (set in :meth:`_negotiate` alone)."""
        self.metadata = False
        """True once both sides speak extension level 2 (request metadata)."""
        self.timeout_defaults = False
        """True once both sides speak extension level 3 (a default timeout)."""
        self.meta: MetaState[int] = MetaState()
        """Request metadata; keyed by the id of a request's first message."""
        self.codec = ChatterConnection(dialect, max_size=peer.options.max_size, strict=strict)
        self._on_result = peer.on_result
        self.sbs_repo = sbs_repo or schemas.repository()
        sender = self.sender = ChatterSender(peer, self.codec, self.meta, self.sbs_repo, self)
        """Our requests, notifications and cancellations as messages
        (:mod:`rpc.chatter_sending`); it reads the extension level off the flags above.
        Its parts are bound here, not wrapped: a request costs no call or look-up more."""
        self.send_request = sender.send_request
        self.send_request_meta = sender.send_request_meta
        self.send_request_part = sender.send_request_part
        self.send_request_end = sender.send_request_end
        self.send_notification = sender.send_notification
        self.abandon = sender.abandon
        payloads = self.payloads = SbsPayloads(self.sbs_repo)
        self._sbs_names = payloads.names
        self.encode_request = payloads.encode_request
        self.encode_result = payloads.encode_result
        self.decode_params = payloads.decode_params
        self.decode_result = payloads.decode_result
        """How values and payloads convert (:mod:`rpc.chatter_payloads`), bound here."""
        self.pings = ChatterPings(peer, self.codec, ping_interval, ping_timeout, self._ping)
        self._last_ping: Conversation | None = None
        self.stall = MessageStall(peer)  # the least rate of an unfinished message
        replies = self.replies = ChatterReplies(
            peer, self.codec, self.payloads, self.sbs_repo, sender.send
        )
        """Our replies in the peer's conversations: when they may go, and as what
        (:mod:`rpc.chatter_replies`). Its parts are bound here, not wrapped: a message
        costs no call or look-up more."""
        self._foreign = replies.foreign
        self._waits = replies.waits
        self._token_back = replies.token_back
        self.drop_request = replies.drop
        self.send_result = replies.send_result
        self.send_result_part = replies.send_result_part
        self.send_result_end = replies.send_result_end
        self.send_error = replies.send_error
        self.send_retry = replies.send_retry

    def _take_codec_output(self) -> None:
        """Pongs and Pings the codec queued itself go out with our own output."""
        data = self.codec.data_to_send()
        if data:
            self.peer.outbox.push(data)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.extensions and self.codec.dialect is Dialect.CURRENT:
            self.codec.send_ping(self.handshake.hello())
            self._take_codec_output()
        self.pings.start()
        self.stall.start()

    def stop(self) -> None:
        """What the connection held goes now, not with a cyclic collection of the peer
        (which lives in reference cycles): the codec's table of conversations (an entry
        per unanswered request, up to ``max_conversations``) and a part-read frame, the
        replies' records, metadata waiting for its request."""
        self.replies.clear()
        self.codec.forget()
        self.meta.clear()

    def handshake_pending(self) -> bool:
        return self.pings.handshake_pending()

    def input_held(self) -> None:
        self.pings.input_held()

    def _ping(self) -> None:
        """A Ping of our plan. The previous one, if still unanswered (we hold the peer's
        input: its Pong waits unread), is abandoned, its Pong dropped when it comes (any
        byte counts as heard): a hold keeps one Ping open, not one more every half
        ``ping_timeout`` for as long as it lasts."""
        codec = self.codec
        if self._last_ping is not None:
            codec.abandon(self._last_ping)
        self._last_ping = Conversation.ours(codec.send_ping().id)
        self._take_codec_output()
        self.peer.outbox.flush()

    def last_word(self, exc: ProtocolError) -> None:
        """Chatter sends nothing before closing on a peer's error."""

    # --- receiving -------------------------------------------------------------------------

    @property
    def missing(self) -> int:
        return self.codec.missing

    def decode(self, data: bytes | memoryview, read_at: float) -> list[Msg]:
        self.pings.read(read_at)
        codec = self.codec
        pings, pongs = codec.pings_received, codec.pongs_received
        messages = codec.receive_data(data)
        if codec.pings_received != pings or codec.pongs_received != pongs:
            self._heard_pings(codec.pings_received != pings, codec.pongs_received != pongs)
        self.stall.read(read_at, len(data), codec.buffered)
        return messages

    def _heard_pings(self, pinged: bool, ponged: bool) -> None:
        """A read brought Pings or Pongs (the codec queues output only then: the Pongs)."""
        codec = self.codec
        self._take_codec_output()
        if pinged and self.peer.outbox.blocked:  # its Pongs add to output that waits
            self.peer.answered_while_blocked()
        self.pings.heard_liveness(ponged=ponged)
        ping_data, pong_data = codec.take_ping_data()
        if codec.dialect is Dialect.CURRENT:  # the legacy dialect has no extension
            self._negotiate(ping_data, pong_data)

    def _negotiate(self, ping_data: list[bytes], pong_data: list[bytes]) -> None:
        """The extension handshake hears this read's Pings and Pongs: send the Ping it
        names, and take its level."""
        ping = self.handshake.heard(ping_data, pong_data)
        if ping is not None:
            self.codec.send_ping(ping)
            self._take_codec_output()
        level = self.handshake.level
        self.cancels, self.metadata, self.timeout_defaults = level >= 1, level >= 2, level >= 3

    def is_reply(self, msg: Msg) -> bool:
        return not msg.owner  # a message in a conversation we started

    def serves_running(self, msg: Msg) -> bool:
        first = self.follows_request(msg)
        if first is None:
            return False
        if first == msg.first:  # a later message in its conversation
            return self.peer.takes_parts(Conversation(False, first))
        return self.peer.cancellable(Conversation(False, first))

    def feeds_stream(self, msg: Msg) -> bool:
        first = self.follows_request(msg)
        return (
            first is not None
            and first == msg.first
            and self.peer.has_stream(Conversation(False, first))
        )

    def opens_request(self, msg: Msg) -> int | None:
        # the first message of a conversation the peer started, not its last: a request
        return msg.id if msg.owner and msg.first == msg.id and not msg.last else None

    def is_part(self, msg: Msg) -> bool:
        return msg.owner and msg.first != msg.id  # (a later message in the peer's conversation)

    def follows_request(self, msg: Msg) -> int | None:
        if not msg.owner:
            return None
        first = msg.first
        if first != msg.id:  # a later message in a conversation the peer started
            return first
        if not (msg.last and self.cancels):
            return None
        module = msg.module
        if (f"{module}.{msg.type}" if module else msg.type) != _CANCEL:
            return None
        cancelled = self.payloads.decode(_CANCEL, msg.data)  # (undecodable: told as it runs)
        return cancelled if isinstance(cancelled, int) and cancelled != first else None

    def message_size(self, msg: Msg) -> int:
        return len(msg.data) + text_size(msg.type) + (text_size(msg.module) if msg.module else 0)

    def dispatch(self, msg: Msg) -> None:
        # each field read once; a conversation built as Conversation.of_received builds it,
        # without its call, and not for a notification
        module = msg.module
        op = f"{module}.{msg.type}" if module else msg.type
        first = msg.first
        if not msg.owner:  # a reply in a conversation we started
            conv = _new(Conversation, (True, first))
            if op == RESULT:  # the common reply, without a call more
                self._on_result(conv, msg.data)
            else:
                self._on_reply(conv, op, msg)
            return
        if first != msg.id:  # a stream request's part or End, or its requester's end
            conv = _new(Conversation, (False, first))
            if op == PART:
                self.peer.on_request_part(conv, msg.data)
            if op == END or (msg.token and self.codec.strict):  # token back: parts end
                self._waits.stream_ended(conv)
                self.peer.on_request_end(conv)
                self._token_back(conv)
            if msg.last:  # the requester ended its conversation: nothing can go back in it
                self.peer.on_request_end(conv)  # nor more parts come (a no-op after its End)
                self.replies.ended(conv)
            return
        peer = self.peer  # a peer starts a conversation
        if msg.last:
            if op == _CANCEL and self.cancels:
                cancelled = self._sbs_decode(op, msg.data, None)
                if isinstance(cancelled, int):
                    peer.on_cancel(Conversation(False, cancelled))
                return
            if op == _META and self.metadata:
                self.meta.receive(metadata.decode_sbs, msg.data, peer)
                return
            if op == _TIMEOUT and self.timeout_defaults:
                self.meta.receive_default(metadata.decode_timeout_sbs, msg.data, peer)
                return
            peer.on_notification(op, self.payloads.incoming(op, msg.data))
            return
        conv = _new(Conversation, (False, first))
        if module is not None and module != RPC_MODULE:  # a plain Hat peer
            self._foreign.add(conv)
            self.retry_results = False  # (this read's requests past the limits wait too:
            # Responder.refuses holds them)
        token = msg.token
        if not token and not self.codec.strict:  # a stream request: parts to come
            self._waits.stream_opened(conv)
        if token and op in self._sbs_names:
            payload: Incoming = self.payloads.incoming(op, msg.data)
        else:  # else incoming() keeps the bytes
            payload = msg.data
        meta = self.meta
        if not meta.pending and meta.default is None:
            peer.on_request(conv, op, payload, not token)
        else:
            intercept.request_with_meta(peer, meta, conv, first, op, payload, not token)

    def _on_reply(self, conv: Conversation, op: str, msg: Msg) -> None:
        """A reply other than ``PeerwireRpc.Result`` (which :meth:`dispatch` hands over)."""
        peer = self.peer
        if op == ERROR:
            peer.on_error(conv, self._sbs_decode(op, msg.data, _undecodable))
        elif op == RETRY:
            retry = self._sbs_decode(op, msg.data, None)
            if retry is None:
                peer.on_error(conv, "undecodable PeerwireRpc.Retry result")
            else:
                peer.on_retry(conv, retry["waitMs"] / 1000, retry["message"])
        elif op == PART:
            peer.on_result_part(conv, msg.data)
            if msg.last or (msg.token and self.codec.strict):  # the peer sends no End then
                self.codec.abandon(conv)  # nor do we: over (a no-op once closed)
                peer.on_result_end(conv)
        elif op == END:
            peer.on_result_end(conv)
        elif msg.last:
            peer.on_result(conv, self.payloads.incoming(op, msg.data))
        else:
            peer.on_result_part(conv, self.payloads.incoming(op, msg.data))

    def _sbs_decode(self, op: str, data: bytes, fallback: Any) -> Any:
        value = self.payloads.decode(op, data)
        if type(value) is Undecodable:
            violations.warning("chatter peer %s: %s", self.peer.remote_address, value.reason)
            return fallback(data) if callable(fallback) else fallback
        return value


def _undecodable(data: bytes) -> str:
    return f"undecodable PeerwireRpc.Error result ({len(data)} bytes)"


class ChatterPeer(Peer[Conversation]):
    """A :class:`~rpc.peer.Peer` speaking Hat Chatter (see the module doc for the mapping).

    ``dialect=None`` (servers) detects the dialect from the first frame; ``strict=False``
    turns off the conversation checks for peers that do not keep them; ``sbs_repo`` is the
    schema repository for typed payloads (default: peerwire's bundled schemas).
    ``extensions=True`` (what :func:`rpc.connect` sets) announces peerwire's extensions in
    the current dialect (see :mod:`rpc.chatter_extension`); the legacy dialect has no room for it.
    ``retry_results=False``: requests past ``max_concurrent`` wait (:mod:`rpc.backlog`) instead
    of getting a ``PeerwireRpc.Retry`` (which Hat peers cannot decode; None: True).
    ``ping_interval`` (s of inbound silence before a Ping; None: no Pings) and
    ``ping_timeout`` (s within which something must come back) default to 20 s each, as in
    both reference implementations (hat-drivers, hat-chatter): a Hat peer kept busy that
    long by a handler still holds its connection to them, and so to us.
    """

    def __init__(
        self,
        registry: Registry | None = None,
        options: Options | None = None,
        *,
        dialect: Dialect | None = None,
        ping_interval: float | None = 20.0,
        ping_timeout: float = 20.0,
        strict: bool = True,
        sbs_repo: hat.sbs.Repository | None = None,
        extensions: bool = False,
        retry_results: bool | None = True,
    ) -> None:
        super().__init__(
            lambda peer: ChatterAdapter(
                peer,
                dialect=dialect,
                ping_interval=ping_interval,
                ping_timeout=ping_timeout,
                strict=strict,
                sbs_repo=sbs_repo,
                extensions=extensions,
                retry_results=retry_results is not False,
            ),
            registry,
            options,
        )

    @property
    def chatter(self) -> ChatterAdapter:
        adapter = self.adapter
        if not isinstance(adapter, ChatterAdapter):
            raise TypeError("not a Chatter peer")
        return adapter

    @property
    def codec(self) -> ChatterConnection:
        return self.chatter.codec

    @property
    def sbs_repo(self) -> hat.sbs.Repository:
        return self.chatter.sbs_repo

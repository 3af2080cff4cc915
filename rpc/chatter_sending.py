"""Our requests over Hat Chatter, as :mod:`rpc.chatter_peer` maps them: each a new
conversation, with a stream request's parts and End, notifications, request metadata
(``PeerwireRpc.Meta``) and the default timeout (``PeerwireRpc.Timeout``), and the
cancellation of a call we gave up on (``PeerwireRpc.Cancel``).

:class:`ChatterSender` turns them into messages and queues them in the peer's outbox; its
:meth:`~ChatterSender.send` queues any message, our replies too (:mod:`rpc.chatter_replies`
is given it). One per connection, owned by the :class:`~rpc.chatter_peer.ChatterAdapter`,
which makes it with what it needs (the codec, the peer, the request metadata state, the
schemas) and exposes its ``send_request*``, ``send_notification`` and ``abandon`` as bound
methods: a request costs no call or look-up more. The extension level it reads (whether
the peer takes cancellations, a default timeout) stays the adapter's alone
(:class:`Extensions`): the handshake changes it as the connection runs. It holds no state
of its own beyond what it is given: what it sends is the outbox's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from rpc.chatter_replies import END, PART, RPC_MODULE
from rpc.payload import PayloadError
from wire import metadata
from wire.chatter import ChatterConnection, Conversation, Dialect
from wire.errors import MessageTooLarge

if TYPE_CHECKING:
    import hat.sbs

    from rpc.peer import Peer
    from rpc.request_meta import MetaState

_LEGACY = Dialect.LEGACY
"""Read per message sent: an Enum member off its class costs a descriptor call (about
100 ns in Python 3.11), a global does not."""
_new = tuple.__new__
"""Builds a :class:`Conversation` as its own classmethods do (see wire.chatter.conversations)."""

CANCEL = f"{RPC_MODULE}.Cancel"
META = f"{RPC_MODULE}.Meta"
TIMEOUT = f"{RPC_MODULE}.Timeout"
"""The types of the extension's messages (each one a whole conversation)."""


class Extensions(Protocol):
    """The extension level both sides speak, as the sender reads it: the adapter's flags
    (:class:`rpc.options.Adapter`), which its handshake sets as the connection runs."""

    @property
    def cancels(self) -> bool: ...
    @property
    def timeout_defaults(self) -> bool: ...


class ChatterSender:
    """Sends our requests and notifications over one connection (see the module doc)."""

    __slots__ = (
        "_codec",
        "_encode_open",
        "_level",
        "_meta",
        "_outbox",
        "_peer",
        "_push",
        "_sbs_repo",
    )

    def __init__(
        self,
        peer: Peer[Conversation],
        codec: ChatterConnection,
        meta: MetaState[int],
        sbs_repo: hat.sbs.Repository,
        level: Extensions,
    ) -> None:
        self._peer = peer
        self._codec = codec
        self._encode_open = codec.encode_open
        self._meta = meta
        """Request metadata, shared with the adapter's receiving side: the default timeout
        we announced (``sent_default``) is ours to change."""
        self._sbs_repo = sbs_repo
        self._level = level
        self._outbox = peer.outbox
        self._push = peer.outbox.push
        """The peer's outbox (made before its adapter, kept for its life), and its push bound."""

    def send(self, op: str, data: bytes, conv: Conversation | None, token: bool, last: bool) -> int:
        """Queue one message (in a new conversation when ``conv`` is None); its id. In the
        legacy dialect ``op`` is split into ``module.type``."""
        codec = self._codec
        if codec.dialect is _LEGACY and "." in op:
            module, _, op = op.rpartition(".")
            msg_id, frame = codec.encode(
                op, data, conversation=conv, token=token, last=last, module=module
            )
        else:
            msg_id, frame = codec.encode(op, data, conversation=conv, token=token, last=last)
        if len(frame) == 1:  # the common case: no pieces to count
            self._push(frame[0])
        else:
            self._outbox.push_message(frame)
        return msg_id

    def send_request(self, op: str, payload: bytes, stream: bool) -> Conversation:
        """PayloadError for a payload that fits ``max_size`` but not with its envelope (the
        caller's error, as a payload over it is: nothing queued, the connection lives on)."""
        if self._meta.sent_default is not None and self._meta.cover(None):
            self._announce()  # it goes without a timeout: say so first
        # the common request (current dialect, strict, one piece): the codec makes its
        # conversation and its frame in one call (see encode_open)
        opened = self._encode_open(op, payload, not stream)
        if opened is not None:
            self._push(opened[1])
            return opened[0]
        try:  # _write_request written out: once per request
            return _new(Conversation, (True, self.send(op, payload, None, not stream, False)))
        except MessageTooLarge as exc:
            raise PayloadError(f"{op}: {exc}") from None

    def _write_request(self, op: str, payload: bytes, stream: bool) -> Conversation:
        try:
            return Conversation.ours(self.send(op, payload, None, not stream, False))
        except MessageTooLarge as exc:
            raise PayloadError(f"{op}: {exc}") from None

    def send_request_meta(
        self,
        op: str,
        payload: bytes,
        stream: bool,
        entries: Mapping[str, str],
        timeout: float | None,
    ) -> Conversation:
        """:meth:`send_request` preceded by its ``PeerwireRpc.Meta`` (``entries``, and
        ``timeout``, the seconds the caller has left); ValueError for entries past
        :mod:`wire.metadata`'s limits. Only once the adapter's ``metadata`` is on. At level
        3 a request with a timeout alone goes without metadata under the default announced
        for it (once per timeout)."""
        ms = None if timeout is None else metadata.timeout_ms(timeout)
        if not entries and self._level.timeout_defaults:
            if self._meta.cover(ms):
                self._announce()
            return self._write_request(op, payload, stream)
        # The Meta takes the next id and names the one after it, the request's. Both are
        # encoded before either is queued: a request too large to send (MessageTooLarge)
        # leaves no Meta behind naming the id the next request will get, only a gap in the
        # ids (which need only increase). Current dialect only (metadata is never on in
        # the legacy one): no ``module.type`` split.
        codec = self._codec
        data = metadata.encode_sbs(codec.next_id + 1, metadata.RequestMeta(ms, entries))
        try:
            _, meta_frame = codec.encode(META, data)
            msg_id, frame = codec.encode(op, payload, token=not stream, last=False)
        except MessageTooLarge as exc:
            raise PayloadError(f"{op}: {exc}") from None
        self._outbox.push_message(meta_frame)
        self._outbox.push_message(frame)
        return Conversation.ours(msg_id)

    def _announce(self) -> None:
        """Tell the peer the time left of the requests we send without metadata from now on
        (the default :meth:`MetaState.cover` chose)."""
        self.send(TIMEOUT, metadata.encode_timeout_sbs(self._meta.sent_default), None, True, True)

    def send_request_part(self, key: Conversation, payload: bytes) -> None:
        try:
            self.send(PART, payload, key, token=False, last=False)
        except MessageTooLarge as exc:  # the caller forgets the stream (a cancel follows)
            raise PayloadError(f"a stream request's part: {exc}") from None

    def send_request_end(self, key: Conversation) -> None:
        self.send(END, b"", key, token=True, last=False)

    def send_notification(self, name: str, payload: bytes) -> None:
        self.send(name, payload, None, token=True, last=True)

    def abandon(self, key: Conversation) -> None:
        """We gave up on ``key``: its late messages are dropped; a peerwire peer is told so
        (the cancellation extension) and cancels the handler. Without the extension (the
        legacy dialect), a stream request of ours still sending parts (we hold the token)
        is ended with its End, the conversation's last, so that the handler there ends
        instead of waiting for parts for as long as the connection lasts."""
        codec = self._codec
        if not self._level.cancels and self._peer.is_open and codec.holds_token(key):
            self.send(END, b"", key, token=True, last=True)
        codec.abandon(key)
        if self._level.cancels and self._peer.is_open:
            self.send(CANCEL, self._sbs_repo.encode(CANCEL, key.first), None, True, True)

"""Our requests over Hat Chatter, as :mod:`rpc.chatter_peer` maps them: each a new
conversation, with a stream request's parts and End, notifications, request metadata
(``PeerwireRpc.Meta``) and the default timeout (``PeerwireRpc.Timeout``), and the
cancellation of a call we gave up on (``PeerwireRpc.Cancel``).

:class:`ChatterSender` is the base of :class:`~rpc.chatter_peer.ChatterAdapter` that
sends them (the adapter sets up the attributes it names); its :meth:`~ChatterSender._send`
queues any message, our replies too (:mod:`rpc.chatter_replies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rpc.chatter_replies import END, PART, RPC_MODULE
from rpc.payload import PayloadError
from wire import metadata
from wire.chatter import ChatterConnection, Conversation, Dialect
from wire.errors import MessageTooLarge

if TYPE_CHECKING:
    from collections.abc import Callable

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


class ChatterSender:
    """Sends our requests and notifications (see the module doc)."""

    peer: Peer[Conversation]
    codec: ChatterConnection
    meta: MetaState[int]
    sbs_repo: hat.sbs.Repository
    cancels: bool
    timeout_defaults: bool
    _encode_open: Callable[[str, bytes, bool], tuple[Conversation, bytes] | None]
    _push: Callable[[bytes], None]

    def _send(
        self, op: str, data: bytes, conv: Conversation | None, token: bool, last: bool
    ) -> int:
        """Queue one message (in a new conversation when ``conv`` is None); its id. In the
        legacy dialect ``op`` is split into ``module.type``."""
        codec = self.codec
        if codec.dialect is _LEGACY and "." in op:
            module, _, op = op.rpartition(".")
            msg_id, frame = codec.encode(
                op, data, conversation=conv, token=token, last=last, module=module
            )
        else:
            msg_id, frame = codec.encode(op, data, conversation=conv, token=token, last=last)
        if len(frame) == 1:  # the common case: no pieces to count
            self.peer.outbox.push(frame[0])
        else:
            self.peer.outbox.push_message(frame)
        return msg_id

    def send_request(self, op: str, payload: bytes, stream: bool) -> Conversation:
        """PayloadError for a payload that fits ``max_size`` but not with its envelope (the
        caller's error, as a payload over it is: nothing queued, the connection lives on)."""
        if self.meta.sent_default is not None and self.meta.cover(None):
            self._announce()  # it goes without a timeout: say so first
        # the common request (current dialect, strict, one piece): the codec makes its
        # conversation and its frame in one call (see encode_open)
        opened = self._encode_open(op, payload, not stream)
        if opened is not None:
            self._push(opened[1])
            return opened[0]
        try:  # _write_request written out: once per request
            return _new(Conversation, (True, self._send(op, payload, None, not stream, False)))
        except MessageTooLarge as exc:
            raise PayloadError(f"{op}: {exc}") from None

    def _write_request(self, op: str, payload: bytes, stream: bool) -> Conversation:
        try:
            return Conversation.ours(self._send(op, payload, None, not stream, False))
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
        :mod:`wire.metadata`'s limits. Only once :attr:`metadata` is on. At level 3 a request
        with a timeout alone goes without metadata under the default announced for it (once
        per timeout)."""
        ms = None if timeout is None else metadata.timeout_ms(timeout)
        if not entries and self.timeout_defaults:
            if self.meta.cover(ms):
                self._announce()
            return self._write_request(op, payload, stream)
        # The Meta takes the next id and names the one after it, the request's. Both are
        # encoded before either is queued: a request too large to send (MessageTooLarge)
        # leaves no Meta behind naming the id the next request will get, only a gap in the
        # ids (which need only increase). Current dialect only (metadata is never on in
        # the legacy one): no ``module.type`` split.
        codec = self.codec
        data = metadata.encode_sbs(codec.next_id + 1, metadata.RequestMeta(ms, entries))
        try:
            _, meta_frame = codec.encode(META, data)
            msg_id, frame = codec.encode(op, payload, token=not stream, last=False)
        except MessageTooLarge as exc:
            raise PayloadError(f"{op}: {exc}") from None
        self.peer.outbox.push_message(meta_frame)
        self.peer.outbox.push_message(frame)
        return Conversation.ours(msg_id)

    def _announce(self) -> None:
        """Tell the peer the time left of the requests we send without metadata from now on
        (the default :meth:`MetaState.cover` chose)."""
        self._send(TIMEOUT, metadata.encode_timeout_sbs(self.meta.sent_default), None, True, True)

    def send_request_part(self, key: Conversation, payload: bytes) -> None:
        try:
            self._send(PART, payload, key, token=False, last=False)
        except MessageTooLarge as exc:  # the caller forgets the stream (a cancel follows)
            raise PayloadError(f"a stream request's part: {exc}") from None

    def send_request_end(self, key: Conversation) -> None:
        self._send(END, b"", key, token=True, last=False)

    def send_notification(self, name: str, payload: bytes) -> None:
        self._send(name, payload, None, token=True, last=True)

    def abandon(self, key: Conversation) -> None:
        """We gave up on ``key``: its late messages are dropped; a peerwire peer is told so
        (the cancellation extension) and cancels the handler. Without the extension (the
        legacy dialect), a stream request of ours still sending parts (we hold the token)
        is ended with its End, the conversation's last, so that the handler there ends
        instead of waiting for parts for as long as the connection lasts."""
        codec = self.codec
        if not self.cancels and self.peer.is_open and codec.holds_token(key):
            self._send(END, b"", key, token=True, last=True)
        codec.abandon(key)
        if self.cancels and self.peer.is_open:
            self._send(CANCEL, self.sbs_repo.encode(CANCEL, key.first), None, True, True)

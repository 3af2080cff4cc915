"""Our replies in the conversations a Chatter peer started: when they may go, and as what.

Only the token holder sends in a Chatter conversation. A reply made while the requester
still holds the token (it still sends a stream's parts) waits for it
(:mod:`rpc.token_waits`); a conversation that has ended takes nothing more. A plain Hat
peer's request (legacy dialect, module other than ``PeerwireRpc``) is never answered with a
``PeerwireRpc`` type: hat-chatter 0.5 drops the connection on a type it does not know (see
:mod:`rpc.chatter_peer`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from rpc.chatter_payloads import Reply, SbsPayloads
from rpc.errors import retry_wait_ms
from rpc.payload import PayloadError
from rpc.peer import Peer
from rpc.token_waits import Send, TokenWaits
from wire.chatter import ChatterConnection, Conversation
from wire.errors import MessageTooLarge

if TYPE_CHECKING:
    import hat.sbs

log = logging.getLogger("peerwire.rpc.chatter")

RPC_MODULE = "PeerwireRpc"
PART, END, ERROR, RETRY, RESULT = (
    f"{RPC_MODULE}.{t}" for t in ("Part", "End", "Error", "Retry", "Result")
)


class SendMessage(Protocol):
    """The adapter's ``_send``: queue one message in ``conv``; its id."""

    def __call__(
        self, op: str, data: bytes, conv: Conversation | None, token: bool, last: bool
    ) -> int: ...


class ChatterReplies:
    """One connection's replies to the requests its peer started. The adapter's
    ``send_result``, ``send_result_part``, ``send_result_end``, ``send_error`` and
    ``send_retry`` are these methods, bound: a reply costs no call more."""

    __slots__ = (
        "_encode_last",
        "_peer",
        "_push",
        "_send",
        "_waiting",
        "codec",
        "dropped",
        "foreign",
        "payloads",
        "sbs_repo",
        "waits",
    )

    def __init__(
        self,
        peer: Peer[Conversation],
        codec: ChatterConnection,
        payloads: SbsPayloads,
        sbs_repo: hat.sbs.Repository,
        send: SendMessage,
    ) -> None:
        self._peer = peer
        self._send = send
        self.codec = codec
        self._encode_last = codec.encode_last
        self._push = peer.outbox.push
        """The peer's outbox (made before its adapter, kept for its life), bound."""
        self.payloads = payloads
        self.sbs_repo = sbs_repo
        self.foreign: set[Conversation] = set()
        """Open requests from plain legacy Hat peers: never answered with our own types.
        Freed when answered or when the requester ends the conversation itself."""
        self.dropped: set[Conversation] = set()
        """Stream requests dropped unanswered (:meth:`drop`) while the requester held their
        token: the codec forgets each once the token comes back (:meth:`token_back`), or
        the requester ends it. At most the peer's open conversations."""
        self.waits = TokenWaits(
            peer.options.max_stream_queue, peer.options.max_size, self.send_error
        )
        """Replies to incoming streams waiting for the requester's token (it still sends
        parts); sent once its End hands the token over (see :mod:`rpc.token_waits`): at
        most ``max_stream_queue`` a stream and ``max_size`` bytes over all streams."""
        self._waiting = self.waits.waiting

    def _our_turn(self, key: Conversation, send: Send, *args: Any) -> bool:
        """True when we hold ``key``'s token and may send in it. While the requester holds
        it (it still sends parts) the reply ``send(*args)`` waits for it instead of being
        lost; a conversation that has ended takes nothing more. ``strict=False`` keeps no
        turns: a reply waits only while an incoming stream still takes parts, until its
        End, whatever the token flags say."""
        codec = self.codec
        if codec.holds_token(key) and key not in self._waiting:
            return True
        if codec.strict:
            if not codec.is_open(key):
                return False  # ended: nothing goes back in it
        elif not self.waits.keeps(key):
            return True  # no turns kept: only an incoming stream's End is one
        self.waits.hold(key, send, args)
        return False

    def _answerable(self, key: Conversation, what: str) -> bool:
        """May we end ``key`` (whose token we hold) with one of our own types? (see the
        module doc)"""
        if key in self.foreign:
            self.foreign.discard(key)
            log.info(
                "not sending %s to legacy Hat peer %s (it cannot decode PeerwireRpc types)",
                what,
                self._peer.remote_address,
            )
            return False
        return True

    def drop(self, key: Conversation) -> None:
        """The peer's request ``key`` gets no answer (a graceful close turned it away): it
        is forgotten here, and by the codec while we hold its token (a request waiting for
        its answer: nothing more can come in it, and each one kept open counts toward
        ``max_conversations``). A stream request whose requester still sends parts stays
        open, as any stream does (its parts are dropped by the responder), until it hands
        the token over (:meth:`token_back`): abandoned at once, it would be remembered
        among the codec's last 4,096 abandoned, and its parts after that many more would
        be a violation."""
        codec = self.codec
        if codec.holds_token(key):
            codec.abandon(key)
        elif codec.is_open(key):  # (strict) forgotten once its token comes back
            self.dropped.add(key)
        self.foreign.discard(key)
        self.waits.drop(key)

    def ended(self, key: Conversation) -> None:
        """The requester ended conversation ``key`` itself: nothing can go back in it."""
        self.foreign.discard(key)
        self.waits.drop(key)
        self.dropped.discard(key)

    def clear(self) -> None:
        """The connection is gone."""
        self.foreign.clear()
        self.dropped.clear()
        self.waits.clear()

    def token_back(self, key: Conversation) -> None:
        """The requester handed ``key``'s token over: send what waited for it (a request
        dropped unanswered: the codec forgets it)."""
        if self.dropped and key in self.dropped:
            self.dropped.discard(key)
            self.codec.abandon(key)
        if key in self.waits and (self.codec.holds_token(key) or not self.codec.strict):
            self.waits.release(key)

    def send_result(self, key: Conversation, payload: bytes | Reply, stream: bool) -> None:
        # the common result: bytes, in the current dialect (no legacy Hat requests, so
        # none is foreign), while we hold the token: one call to the codec checks the
        # token, ends the conversation and makes the frame (see encode_last)
        waiting = self._waiting  # (replies waiting for a stream's End: this one waits too)
        if payload.__class__ is bytes and not self.foreign and (not waiting or key not in waiting):
            frame = self._encode_last(key, RESULT, payload)
            if frame is not None:
                self._push(frame)
                return
        if not self._our_turn(key, self.send_result, key, payload, stream):
            return
        if isinstance(payload, Reply):
            self.foreign.discard(key)
            try:
                data = self.payloads.encode(payload.type, payload.value)
            except PayloadError as exc:
                self.send_error(key, str(exc))
                return
            self._send_last(key, payload.type, data)
        elif key not in self.foreign or self._answerable(key, "a PeerwireRpc.Result"):
            try:  # _send_last written out: once per request
                self._send(RESULT, payload, key, True, True)
            except MessageTooLarge as exc:  # the conversation is still ours: say why
                self.send_error(key, str(exc))

    def _send_last(self, key: Conversation, type_name: str, data: bytes) -> None:
        try:
            self._send(type_name, data, key, token=True, last=True)
        except MessageTooLarge as exc:  # the conversation is still ours: say why
            self.send_error(key, str(exc))

    def send_result_part(self, key: Conversation, payload: bytes) -> None:
        if self._our_turn(key, self.send_result_part, key, payload) and key not in self.foreign:
            self._send(PART, payload, key, token=False, last=False)

    def send_result_end(self, key: Conversation, failed: bool) -> None:
        if failed:
            return  # the error result already ended the conversation
        if self._our_turn(key, self.send_result_end, key, failed) and self._answerable(
            key, "a PeerwireRpc.End"
        ):
            self._send(END, b"", key, token=True, last=True)

    def send_error(self, key: Conversation, message: str) -> None:
        if self._our_turn(key, self.send_error, key, message) and self._answerable(
            key, f"an error ({message})"
        ):
            self._send(ERROR, self.sbs_repo.encode(ERROR, message), key, True, True)

    def send_retry(self, key: Conversation, wait: float, message: str) -> None:
        if self._our_turn(key, self.send_retry, key, wait, message) and self._answerable(
            key, "a retry result"
        ):
            data = self.sbs_repo.encode(RETRY, {"waitMs": retry_wait_ms(wait), "message": message})
            self._send(RETRY, data, key, token=True, last=True)

"""One Chatter connection, sans-I/O: bytes in -> messages out, messages in -> bytes out.

Ties framing, the envelope of one dialect and the conversation rules together, and runs
the protocol-level part of the Ping service (answering a Ping with a Pong). When to send a
Ping and when to give up on a silent peer are timer decisions, so they belong to the
caller (the RPC core).
"""

from __future__ import annotations

from wire import DEFAULT_MAX_SIZE
from wire.chatter.conversations import Conversation, ConversationTracker
from wire.chatter.envelope import (
    CURRENT,
    Dialect,
    Msg,
    decode_msg,
    detect_dialect,
    envelope_head,
)
from wire.chatter.framing import SIZE_HEADERS, FrameReader, frame_header
from wire.errors import LocalProtocolError, MessageTooLarge, ProtocolError

PING_TYPES: dict[Dialect, tuple[str | None, str, str]] = {
    Dialect.CURRENT: (None, "HatChatter.Ping", "HatChatter.Pong"),
    Dialect.LEGACY: ("HatPing", "MsgPing", "MsgPong"),
}
"""(module, ping type, pong type) per dialect."""
_CURRENT_PINGS = PING_TYPES[Dialect.CURRENT]
_LEGACY_PINGS = PING_TYPES[Dialect.LEGACY]

JOINED_FRAME = 1024
"""Frames whose body is at most this many bytes are encoded as one piece
(:meth:`ChatterConnection.encode`); larger ones as pieces, so that their payload is copied
only once, when written."""
MAX_PING_DATA = 64
"""Bytes of a Ping's data echoed in its Pong and kept (of a Pong's too); the rest is
dropped with the message, so a connection holds at most a frame and twice this."""
MAX_PING_RECORDS = 8
"""Data of Pings (and of Pongs) kept for :meth:`ChatterConnection.take_ping_data` between
two calls; later ones are not kept (each is still answered)."""


class ChatterConnection:
    """The protocol state of one Chatter connection.

    - ``dialect=None`` detects the dialect from the first frame received (servers);
      sending before it is known raises :class:`~wire.errors.LocalProtocolError`.
    - :meth:`receive_data` accepts any chunking and returns the application messages;
      Ping and Pong are handled here and never returned (a Pong is queued for each Ping).
      With ``strict``, a Ping whose conversation we may not answer in (sent with ``last``,
      or keeping the token) still counts as a Ping (``pings_received``: the peer is alive)
      but gets no Pong: a Pong there would break the rules we hold the peer to. Neither
      reference closes a connection for it (they check no flags and answer every Ping), so
      neither do we. Of a Ping's or a Pong's data, the first :data:`MAX_PING_DATA` bytes
      are kept (``last_ping_data``, ``last_pong_data``, :meth:`take_ping_data`).
    - :meth:`send` queues bytes; :meth:`data_to_send` hands them out in one piece, so a
      caller that sends several messages writes once.
    - Errors: any :class:`~wire.errors.ProtocolError` means the peer broke the protocol and
      the connection must be closed (Chatter sends nothing back). The connection is dead
      afterwards: every further :meth:`receive_data` raises the same error.
    - ``strict=False`` turns off conversation checks (ids, token, ``last``) for peers that
      do not keep them; framing and envelope checks always apply.
    """

    __slots__ = (
        "_dead",
        "_out",
        "_ping_data",
        "_pong_data",
        "_reader",
        "_tracker",
        "dialect",
        "last_ping_data",
        "last_pong_data",
        "max_size",
        "pings_received",
        "pongs_received",
        "strict",
    )

    def __init__(
        self,
        dialect: Dialect | None = None,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        strict: bool = True,
        max_conversations: int = 65536,
    ) -> None:
        self.dialect = dialect
        self.max_size = max_size
        self.strict = strict
        self._reader = FrameReader(max_size)
        self._tracker = ConversationTracker(max_open=max_conversations)
        self._out: list[bytes] = []
        self._dead: ProtocolError | None = None
        self.pings_received = 0
        self.pongs_received = 0
        self.last_ping_data = b""
        """Data of the last Ping received, its first :data:`MAX_PING_DATA` bytes (Hat peers
        send none; peerwire peers announce their extensions there in the current
        dialect)."""
        self.last_pong_data = b""
        """Data of the last Pong received, its first :data:`MAX_PING_DATA` bytes (the echo
        of our Ping's data, from a peer that echoes it)."""
        self._ping_data: list[bytes] = []
        self._pong_data: list[bytes] = []

    # --- receiving ---------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that has not fully arrived."""
        return self._reader.buffered

    @property
    def missing(self) -> int:
        """Bytes the input must still bring to complete the frame held in part (0: none; a
        lower bound while its header is incomplete). A reader that decodes a large read in
        slices cuts them past it."""
        return self._reader.missing

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Msg]:
        if self._dead is not None:
            raise self._dead
        try:  # the whole read in one frame: a call less per read
            buf, spans = self._reader.receive_data(data)
            if not spans:
                return []
            dialect = self.dialect
            if dialect is None:
                start, end = spans[0]
                dialect, _ = detect_dialect(buf, start, end)
                self.dialect = dialect
            # not PING_TYPES[dialect]: an Enum member hashes in Python (enum.__hash__), per read
            module, ping, pong = _CURRENT_PINGS if dialect is CURRENT else _LEGACY_PINGS
            strict = self.strict
            tracker = self._tracker
            messages = []
            for start, end in spans:
                msg = decode_msg(buf, start, end, dialect)
                if strict and not tracker.incoming(msg):
                    continue  # late: dropped
                type_name = msg.type  # one look-up, and the module only for a Ping or a Pong
                if type_name == ping and msg.module == module:
                    self.pings_received += 1
                    data = self.last_ping_data = msg.data[:MAX_PING_DATA]  # not the whole Ping
                    if data and len(self._ping_data) < MAX_PING_RECORDS:
                        self._ping_data.append(data)
                    conversation = Conversation.of_received(msg)
                    if strict and not tracker.holds_token(conversation):
                        continue  # sent with last or without the token: see the class doc
                    # a Pong echoes the Ping's data: peers that put none (all Hat peers) get
                    # none
                    reply = data if dialect is CURRENT else b""
                    self.send(pong, reply, conversation=conversation, module=module)
                elif type_name == pong and msg.module == module:
                    self.pongs_received += 1
                    data = self.last_pong_data = msg.data[:MAX_PING_DATA]
                    if data and len(self._pong_data) < MAX_PING_RECORDS:
                        self._pong_data.append(data)
                else:
                    messages.append(msg)
            return messages
        except ProtocolError as exc:
            self._dead = exc
            raise

    def take_ping_data(self) -> tuple[list[bytes], list[bytes]]:
        """The data of the Pings and of the Pongs received since the last call, oldest
        first, those with data only (Hat peers send none; each cut to
        :data:`MAX_PING_DATA` bytes, at most :data:`MAX_PING_RECORDS` of each): unlike
        ``last_ping_data``, none is hidden by a later one that came in the same read."""
        pings, pongs = self._ping_data, self._pong_data
        if pings or pongs:
            self._ping_data, self._pong_data = [], []
        return pings, pongs

    # --- sending -----------------------------------------------------------------------

    def send(
        self,
        type: str,
        data: bytes = b"",
        *,
        conversation: Conversation | None = None,
        token: bool = True,
        last: bool = True,
        module: str | None = None,
        bounded: bool = True,
    ) -> Msg:
        """Queue one message; ``conversation=None`` starts a new conversation.

        The defaults (``token=True, last=True``) are a one-message conversation, as in the
        references. Raises LocalProtocolError for a send the rules forbid: no token,
        conversation closed, dialect unknown, body above ``max_size``, a conversation past
        ``max_conversations`` of ours open (unless not ``bounded``: see :meth:`send_ping`).
        """
        msg_id, frame = self.encode(
            type,
            data,
            conversation=conversation,
            token=token,
            last=last,
            module=module,
            bounded=bounded,
        )
        self._out += frame
        first, owner = _origin(conversation, msg_id)
        return Msg(msg_id, first, owner, token, last, type, data, module)

    def encode(
        self,
        type: str,
        data: bytes = b"",
        *,
        conversation: Conversation | None = None,
        token: bool = True,
        last: bool = True,
        module: str | None = None,
        bounded: bool = True,
    ) -> tuple[int, list[bytes]]:
        """Like :meth:`send`, but return the message's id and its frame's pieces for the
        caller to write instead of queuing them (for callers with an output buffer of their
        own). No :class:`Msg` is built: this is the hot path of peers that answer many.
        A frame whose body is at most :data:`JOINED_FRAME` bytes comes as one piece.

        The size is checked before the conversation state changes: a message above
        ``max_size`` raises :class:`~wire.errors.MessageTooLarge` and leaves the
        conversation as it was, so the caller can still answer in it (with an error).
        """
        dialect = self.dialect
        if dialect is None:
            raise LocalProtocolError("Chatter dialect not known yet; nothing received")
        tracker = self._tracker
        msg_id = tracker.next_id
        if conversation is None:  # _origin written out: once per message
            first, owner = msg_id, True
        else:
            owner, first = conversation
        data_size = len(data)
        head = envelope_head(msg_id, first, owner, token, last, type, module, data_size, dialect)
        size = len(head) + data_size
        if size > self.max_size:
            raise MessageTooLarge(f"Chatter message of {size} bytes exceeds max_size")
        if self.strict:
            tracker.outgoing(conversation, token, last, bounded)
        else:
            tracker.next_id = msg_id + 1  # outgoing_unchecked written out
        if size < 256:  # one piece, frame_header written out
            return msg_id, [b"".join((SIZE_HEADERS[size], head, data))]
        if size <= JOINED_FRAME:  # one piece: cheaper to queue and to join at the flush
            return msg_id, [b"".join((frame_header(size), head, data))]
        return msg_id, [frame_header(size) + head, data]

    def encode_last(self, conversation: Conversation, type: str, data: bytes) -> bytes | None:
        """The frame of the message that ends ``conversation`` with the token (``last``, no
        module), as :meth:`encode` makes it, for the common reply: current dialect,
        ``strict``, this side holding the token, a frame of at most :data:`JOINED_FRAME`
        bytes within ``max_size``. None, nothing changed, when any of that does not hold:
        the caller takes :meth:`encode`, which sends it or says why not. The token is
        checked and the conversation ended in one look-up (a check before :meth:`encode`
        and its own record take three), and no :class:`Msg` nor pieces list is made."""
        if self.dialect is not CURRENT or not self.strict:
            return None
        tracker = self._tracker
        msg_id = tracker.next_id
        owner, first = conversation
        data_size = len(data)
        head = envelope_head(msg_id, first, owner, True, True, type, None, data_size, CURRENT)
        size = len(head) + data_size
        if size > JOINED_FRAME or size > self.max_size:
            return None
        if not tracker.end_with_token(conversation):
            return None
        return b"".join((SIZE_HEADERS[size] if size < 256 else frame_header(size), head, data))

    def encode_open(
        self, type: str, data: bytes, token: bool = True
    ) -> tuple[Conversation, bytes] | None:
        """The conversation and the frame of the message that opens one (not ``last``, no
        module), as :meth:`encode` makes them, for the common request: current dialect,
        ``strict``, a frame of at most :data:`JOINED_FRAME` bytes within ``max_size``,
        fewer than ``max_conversations`` of ours open. ``token``: passed to the peer (a
        request), or kept (a stream request). None, nothing changed, when any of that does
        not hold: the caller takes :meth:`encode`, which sends it or says why not. The
        conversation is made once, as the key the tracker records it under, and no pieces
        list."""
        if self.dialect is not CURRENT or not self.strict:
            return None
        tracker = self._tracker
        msg_id = tracker.next_id
        data_size = len(data)
        head = envelope_head(msg_id, msg_id, True, token, False, type, None, data_size, CURRENT)
        size = len(head) + data_size
        if size > JOINED_FRAME or size > self.max_size:
            return None
        conversation = tracker.open_ours(token)
        if conversation is None:  # max_conversations open
            return None
        return conversation, b"".join(
            (SIZE_HEADERS[size] if size < 256 else frame_header(size), head, data)
        )

    def send_ping(self, data: bytes = b"") -> Msg:
        """Queue a Ping in a new conversation that the peer's Pong will close.

        ``data`` (at most ``MAX_PING_DATA`` bytes) is allowed in the current dialect only:
        the legacy Ping type has no room for it. A Ping is not refused when
        ``max_conversations`` of ours are open (requests waiting for a slow peer): the
        liveness check must not wait for them. Pings go on a plan (the caller's timers),
        and each Pong ends its conversation, so they add few.
        """
        dialect = self._require_dialect()
        if data and (dialect is Dialect.LEGACY or len(data) > MAX_PING_DATA):
            raise LocalProtocolError("Ping data: current dialect only, at most 64 bytes")
        module, ping, _ = PING_TYPES[dialect]
        return self.send(ping, data, token=True, last=False, module=module, bounded=False)

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one bytes object."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return b"".join(out)

    def forget(self) -> None:
        """Drop everything the connection holds, for when it is over: its conversations (an
        entry per unanswered message, up to ``max_conversations``), a frame that had not
        fully arrived (up to ``max_size``) and unsent output. Its owner may outlive the
        connection (until a cyclic collection, for instance); so does none of this."""
        self._tracker.forget()
        self._reader = FrameReader(self.max_size)
        self._out = []
        self._ping_data = []
        self._pong_data = []

    # --- conversations -----------------------------------------------------------------

    def abandon(self, conversation: Conversation) -> None:
        """Forget an open conversation (timed out, cancelled); late messages are dropped."""
        self._tracker.abandon(conversation)

    def holds_token(self, conversation: Conversation) -> bool:
        """True while this side may send in ``conversation``."""
        return self._tracker.holds_token(conversation)

    def is_open(self, conversation: Conversation) -> bool:
        return self._tracker.is_open(conversation)

    @property
    def next_id(self) -> int:
        """The message id the next message we send will carry."""
        return self._tracker.next_id

    @property
    def open_conversations(self) -> int:
        return self._tracker.open_count

    def _require_dialect(self) -> Dialect:
        if self.dialect is None:
            raise LocalProtocolError("Chatter dialect not known yet; nothing received")
        return self.dialect


def _origin(conversation: Conversation | None, msg_id: int) -> tuple[int, bool]:
    """(first, owner) of message ``msg_id`` sent in ``conversation`` (None: it starts one)."""
    if conversation is None:
        return msg_id, True
    return conversation[1], conversation[0]

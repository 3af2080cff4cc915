"""Chatter conversation rules for one connection: ids, ``first``/``owner``, token, ``last``.

A conversation is keyed by ``(owner, first)`` from the LOCAL point of view: ``owner`` is
True for conversations we started. The side holding the token is the only one allowed to
send in it; a message with ``last`` closes it. Neither reference enforces this; we do
(``strict``), and report a peer's violation as :class:`~wire.errors.ConversationError`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

from wire.chatter.envelope import Msg
from wire.errors import ConversationError, LocalProtocolError

_new = tuple.__new__
"""Builds the tuple directly: a NamedTuple's own constructor is a Python function (about
twice the cost), and conversations are made per message on both sides."""


class Conversation(NamedTuple):
    """A conversation as seen from this side of the connection."""

    owner: bool
    """True when this side started it."""
    first: int
    """Id of the message that started it."""

    @classmethod
    def of_received(cls, msg: Msg) -> Conversation:
        """The conversation a received message belongs to (flags flipped to our side)."""
        return _new(cls, (not msg.owner, msg.first))

    @classmethod
    def ours(cls, first: int) -> Conversation:
        """The conversation we started with message ``first``."""
        return _new(cls, (True, first))


class ConversationTracker:
    """Per-connection conversation state: which are open and who holds each token.

    Memory is bounded: at most ``max_open`` open conversations started by each side (the
    peer opening more of its own is a violation; we refuse to open more of ours, but for a
    Ping: see :meth:`outgoing`) and ``max_abandoned`` remembered conversations of the peer's
    that we abandoned. The two sides are counted apart: our own requests filling the table
    do not make the peer's next conversation (a Hat peer's Ping) a violation of its own.

    Late messages are dropped, not reported as errors. In a conversation we started, the
    peer's message (``owner`` False) whose ``first`` is an id we have sent (below
    ``next_id``) but that is no longer open can only be late: a reply to a call we gave up
    on (however many), or a reply after the one with ``last``. It is dropped without any
    record, so abandoning our conversations costs no memory; one whose ``first`` we never
    sent (0, or ``next_id`` and above) is a violation. In a conversation the peer started,
    the token rule leaves no room for a late message (we end one only while holding its
    token), so a message in a closed one is a violation unless we abandoned it while the
    peer held its token (a stream request still sending parts): the last ``max_abandoned``
    such (default 4,096) are remembered until a message with ``last`` or the token (after
    which the peer may send nothing more in it). One abandoned with its token ours (a
    request waiting for its answer) is not remembered: nothing of the peer's can come.
    """

    __slots__ = (
        "_abandoned",
        "_last_received_id",
        "_open",
        "_theirs",
        "max_abandoned",
        "max_open",
        "next_id",
    )

    def __init__(self, *, max_open: int = 65536, max_abandoned: int = 4096) -> None:
        self.max_open = max_open
        self.max_abandoned = max_abandoned
        self.next_id = 1
        """The id the next message we send will carry (read only: the tracker advances it)."""
        self._last_received_id = 0
        # key -> True while WE hold the token
        self._open: dict[tuple[bool, int], bool] = {}
        self._abandoned: OrderedDict[tuple[bool, int], None] = OrderedDict()
        self._theirs = 0
        """Open conversations the peer started (keys with ``owner`` False)."""

    @property
    def open_count(self) -> int:
        return len(self._open)

    def is_open(self, conversation: Conversation) -> bool:
        return conversation in self._open

    def holds_token(self, conversation: Conversation) -> bool:
        """True while this side may send in ``conversation``."""
        return self._open.get(conversation, False)

    def outgoing(
        self, conversation: Conversation | None, token: bool, last: bool, bounded: bool = True
    ) -> tuple[int, int, bool]:
        """Check and record a message we are about to send; return (id, first, owner).

        ``conversation=None`` starts a new one. Raises LocalProtocolError when we do not
        hold the token or the conversation is closed, or when one would be past ``max_open``
        of ours open, unless not ``bounded`` (a Ping: liveness does not wait for requests;
        its Pong ends it).
        """
        msg_id = self.next_id
        if conversation is None:
            if not last:
                if bounded and len(self._open) - self._theirs >= self.max_open:
                    raise LocalProtocolError(f"more than {self.max_open} open conversations")
                self._open[(True, msg_id)] = not token
            self.next_id = msg_id + 1
            return msg_id, msg_id, True
        holder = self._open.get(conversation)  # its own key: it hashes as the tuple does
        if holder is None:
            raise LocalProtocolError(f"conversation {conversation} is not open")
        if not holder:
            raise LocalProtocolError(f"the peer holds the token of conversation {conversation}")
        if last:
            del self._open[conversation]
            if not conversation[0]:
                self._theirs -= 1
        elif token:
            self._open[conversation] = False
        self.next_id = msg_id + 1
        return msg_id, conversation[1], conversation[0]

    def open_ours(self, token: bool) -> Conversation | None:
        """Record a conversation we start with a message that is not ``last`` (``token``:
        passed to the peer, as a request does, or kept) and advance ``next_id``, as
        :meth:`outgoing` does; the conversation, made once as the key it is recorded under,
        or None, nothing changed, with ``max_open`` of ours open (:meth:`outgoing` raises
        then)."""
        conversations = self._open
        if len(conversations) - self._theirs >= self.max_open:
            return None
        msg_id = self.next_id
        conversation = _new(Conversation, (True, msg_id))
        conversations[conversation] = not token  # we hold the token unless we passed it
        self.next_id = msg_id + 1
        return conversation

    def end_with_token(self, conversation: Conversation) -> bool:
        """End ``conversation`` with a ``last`` message of ours and advance ``next_id``, as
        :meth:`outgoing` does, when we hold its token: checked and ended in one look-up.
        False, nothing changed, otherwise (:meth:`outgoing` says why)."""
        conversations = self._open
        holder = conversations.pop(conversation, None)
        if holder is not True:
            if holder is not None:  # the peer's turn: left as it was
                conversations[conversation] = holder
            return False
        if not conversation[0]:
            self._theirs -= 1
        self.next_id += 1
        return True

    def outgoing_unchecked(self, conversation: Conversation | None) -> tuple[int, int, bool]:
        """Assign the next id without any rule checks (lenient connections)."""
        msg_id = self.next_id
        self.next_id = msg_id + 1
        if conversation is None:
            return msg_id, msg_id, True
        return msg_id, conversation[1], conversation[0]

    def incoming(self, msg: Msg) -> bool:
        """Check and record a received message.

        Returns False for a late message (to be dropped: see the class doc); raises
        ConversationError when the peer broke a rule.
        """
        msg_id = msg.id
        first = msg.first
        if not msg.owner and msg.last and msg_id > self._last_received_id:
            # the reply that ends a conversation of ours, what a client reads most: checked
            # and ended in one look-up; anything else goes the general way below
            holder = self._open.pop((True, first), None)
            if holder is False:  # the peer held the token
                self._last_received_id = msg_id
                return True
            if holder:  # ours: put back, for the general way to refuse
                self._open[(True, first)] = True
        if msg_id <= self._last_received_id:
            raise ConversationError(f"message id {msg_id} does not follow {self._last_received_id}")
        self._last_received_id = msg_id
        if msg.owner:
            if first == msg_id:
                if not msg.last:
                    if self._theirs >= self.max_open:
                        raise ConversationError(
                            f"peer opened more than {self.max_open} conversations"
                        )
                    self._open[(False, first)] = msg.token
                    self._theirs += 1
                return True
            key = (False, first)
        else:
            key = (True, first)
        holder = self._open.get(key)
        if holder is None:
            if key[0]:
                if 0 < first < self.next_id:
                    return False  # ours, ended or abandoned: late (see the class doc)
            elif key in self._abandoned:
                if msg.last or msg.token:  # the peer may send nothing more in it
                    del self._abandoned[key]
                return False
            raise ConversationError(f"message {msg_id} for unknown conversation {key}")
        if holder:
            raise ConversationError(f"message {msg_id} sent without the token of {key}")
        if msg.last:
            del self._open[key]
            if not key[0]:
                self._theirs -= 1
        elif msg.token:
            self._open[key] = True
        return True

    def forget(self) -> None:
        """Forget every conversation, open or abandoned (the connection is over); ids go on
        from where they were."""
        self._open = {}
        self._abandoned = OrderedDict()
        self._theirs = 0

    def abandon(self, conversation: Conversation) -> None:
        """Forget an open conversation (e.g. timed out); its late messages get dropped.

        One of ours needs no record (see the class doc), nor one of the peer's whose token
        we hold; one whose token the peer holds is remembered, the oldest forgotten past
        ``max_abandoned``."""
        key = (conversation[0], conversation[1])
        holder = self._open.pop(key, None)
        if holder is None or key[0]:
            return
        self._theirs -= 1
        if holder:  # its token is ours: the peer may send nothing more in it
            return
        self._abandoned[key] = None
        if len(self._abandoned) > self.max_abandoned:
            self._abandoned.popitem(last=False)

"""The one exception family every decoder in :mod:`wire` raises.

A decoder never lets any other exception escape: callers (the RPC core, tests, fuzzers)
catch :class:`ProtocolError` and close the offending connection as its protocol says.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer broke the protocol; the connection it came on should be closed.

    ``code`` is the protocol's own error code where it has one (Gotalk's ``f`` codes);
    ``None`` where the protocol just closes (Chatter).
    """

    code: int | None

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class MalformedMessage(ProtocolError):
    """Bytes that do not parse as a message of the protocol."""


class MessageTooLarge(ProtocolError):
    """A header announced a message larger than the configured ``max_size``.

    Raised from the header alone, before any of the body is buffered.
    """


class UnsupportedVersion(ProtocolError):
    """The peer speaks a protocol version or dialect we do not."""


class ConversationError(ProtocolError):
    """The peer broke a conversation rule (Chatter: token passing, ``last``, ids)."""


class LocalProtocolError(Exception):
    """We were asked to send something the protocol forbids (a programming error).

    Kept apart from :class:`ProtocolError` because it is never the peer's fault and must
    not close a connection as if it were.
    """

"""Hat Chatter, sans-I/O: framing, the ``Msg`` envelope in both dialects, conversations.

- :class:`ChatterConnection` is what a transport drives: ``receive_data`` / ``send`` /
  ``data_to_send``.
- :class:`Dialect` picks ``Hat`` (legacy: hat-chatter 0.5's ``Hat.Msg``) or ``HatChatter``
  (current).
- :func:`encode_frame` / :class:`FrameReader` and :func:`encode_msg` / :func:`decode_msg`
  are the layers underneath, for tools and tests.
"""

from wire.chatter.connection import PING_TYPES, ChatterConnection
from wire.chatter.conversations import Conversation, ConversationTracker
from wire.chatter.envelope import (
    Dialect,
    Msg,
    decode_msg,
    detect_dialect,
    encode_msg,
)
from wire.chatter.framing import FrameReader, frame_header
from wire.sbs import encode_integer


def encode_frame(msg: Msg, dialect: Dialect) -> bytes:
    """One whole frame (header + envelope) for ``msg``; no conversation bookkeeping."""
    body = encode_msg(msg, dialect)
    return frame_header(len(body)) + body


__all__ = [
    "PING_TYPES",
    "ChatterConnection",
    "Conversation",
    "ConversationTracker",
    "Dialect",
    "FrameReader",
    "Msg",
    "decode_msg",
    "detect_dialect",
    "encode_frame",
    "encode_integer",
    "encode_msg",
    "frame_header",
]

"""Sans-I/O codecs for peerwire's wire protocols.

No sockets, no asyncio, no clocks: every codec takes bytes and returns typed messages, and
takes messages and returns bytes. Transports move the bytes; :mod:`rpc` owns timers.

- :mod:`wire.chatter`: Hat Chatter, both dialects (legacy ``Hat`` and current ``HatChatter``).
- :mod:`wire.gotalk`: Gotalk protocol version 1.
- :mod:`wire.gossip`: the gossip broadcast frame of the Elixir Chatter library.
- :mod:`wire.sbs`: the SBS Integer and Bytes primitives (Chatter envelope, Eventer).
"""

__peerwire__ = "wire"  # marks this package as peerwire's (see rpc._packages)

from wire.errors import (
    ConversationError,
    LocalProtocolError,
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    UnsupportedVersion,
)

DEFAULT_MAX_SIZE = 16 * 1024 * 1024
"""Default largest message body any codec accepts (16 MiB)."""

__all__ = [
    "DEFAULT_MAX_SIZE",
    "ConversationError",
    "LocalProtocolError",
    "MalformedMessage",
    "MessageTooLarge",
    "ProtocolError",
    "UnsupportedVersion",
]

"""Sans-I/O codecs for peerwire's wire protocols.

No sockets, no asyncio, no clocks: every codec takes bytes and returns typed messages, and
takes messages and returns bytes. Transports move the bytes; :mod:`rpc` owns timers.

- :mod:`wire.chatter`: Hat Chatter, both dialects (legacy ``Hat`` and current ``HatChatter``).
- :mod:`wire.gotalk`: Gotalk protocol version 1.
- :mod:`wire.gossip`: the gossip broadcast frame of the Elixir Chatter library.
- :mod:`wire.sbs`: the SBS Integer and Bytes primitives (Chatter envelope, Eventer).
"""

__peerwire__ = "wire"  # marks this package as peerwire's (see rpc._packages)

import importlib
import importlib.machinery

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

COMPILABLE = (
    "wire.gotalk.connection",
    "wire.gotalk.decoding",
    "wire.gotalk.encoding",
    "wire.sbs",
    "wire.chatter.connection",
    "wire.chatter.conversations",
    "wire.chatter.envelope",
    "wire.chatter.framing",
)
"""The codec modules the optional compiled build compiles (``PEERWIRE_COMPILE=1``, see
docs/install.md); setup.py reads this tuple."""


def compiled() -> tuple[str, ...]:
    """The modules of :data:`COMPILABLE` this install runs compiled (importing them): all of
    them for a compiled build, none for the pure-Python one or where the extensions cannot
    load (a zip on ``sys.path``, another interpreter), which runs the sources instead."""
    names = []
    for name in COMPILABLE:
        spec = importlib.import_module(name).__spec__
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            names.append(name)
    return tuple(names)


__all__ = [
    "COMPILABLE",
    "DEFAULT_MAX_SIZE",
    "ConversationError",
    "LocalProtocolError",
    "MalformedMessage",
    "MessageTooLarge",
    "ProtocolError",
    "UnsupportedVersion",
    "compiled",
]

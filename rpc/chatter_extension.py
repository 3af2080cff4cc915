"""How two Hat Chatter peers agree on peerwire's extension level, in the data of their Pings.

The client's hello is the data of its first Ping, :data:`HELLO` (level 2, which every
peerwire server since level 2 takes; current dialect only: the legacy one has no room for
Ping data). Hat peers answer with an empty Pong and never see anything else of the
extension. A peerwire peer that did not say hello itself (a server) echoes it (its codec
echoes every Ping's data, whatever level it speaks) and takes level 2 (``peerwire-ext/1``:
level 1); at a higher level it then offers that level in a Ping of its own
(``peerwire-ext/3``). A client takes level 2 from the echo of its hello, and an offered
level (up to its own) from the offer, which it confirms with a Ping naming the level it
took; the server moves up to it on that Ping, and never past what it offered. The echo
alone never takes a client above level 2, so a level-2 server is spoken to at level 2.

Levels: 1 cancellation (``PeerwireRpc.Cancel``), 2 also request metadata
(``PeerwireRpc.Meta``), 3 also a default timeout (``PeerwireRpc.Timeout``).
"""

from __future__ import annotations

LEVEL = 3
"""The extension level we speak."""
_HELLO_PREFIX = b"peerwire-ext/"
HELLO = b"peerwire-ext/2"
"""A client's extension announcement (see the module doc)."""


def hello_of(level: int) -> bytes:
    """The Ping data naming ``level``."""
    return b"%s%d" % (_HELLO_PREFIX, level)


def level_of(data: bytes) -> int | None:
    """The level a Ping's data announces (``peerwire-ext/<digits>``, at most 16 bytes), else
    None."""
    digits = data[len(_HELLO_PREFIX) :]
    if len(data) <= 16 and data.startswith(_HELLO_PREFIX) and digits.isdigit():
        return int(digits)
    return None


class ChatterHandshake:
    """One connection's side of the agreement (see the module doc): it decides, the adapter
    sends the Pings it names. State: the level, whether we said hello, what we offered."""

    __slots__ = ("_offered", "_said_hello", "level")

    def __init__(self) -> None:
        self.level = 0
        """The extension level this side speaks to the peer (0: none)."""
        self._said_hello = False
        self._offered = 0

    def hello(self) -> bytes:
        """The data of a client's first Ping: from now on this side is the client."""
        self._said_hello = True
        return HELLO

    def heard(self, ping_data: list[bytes], pong_data: list[bytes]) -> bytes | None:
        """The data of every Ping and Pong of one read came in (none hidden by a later one,
        :meth:`~wire.chatter.ChatterConnection.take_ping_data`): move :attr:`level` as they
        say, and return the data of a Ping to send (an offer or a confirmation), if any.
        The caller dispatches the read's messages after it, so a Ping that moves the level
        up comes before anything the peer sends at that level."""
        levels = [level for data in ping_data if (level := level_of(data)) is not None]
        asked = min(max(levels, default=0), LEVEL)
        if self._said_hello:  # a client: its hello echoed, then perhaps the server's offer
            if not self.level and HELLO in pong_data:
                self.level = 2
            if self.level and asked > self.level:
                self.level = asked
                return hello_of(asked)  # it confirms
        elif asked and not self.level:  # a server: a client's hello
            self.level = asked
            if asked == 2 < LEVEL:  # a client that may speak more: offer ours
                self._offered = LEVEL
                return hello_of(LEVEL)
        elif self.level < asked <= self._offered:  # the client confirms our offer
            self.level = asked
        return None

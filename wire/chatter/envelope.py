"""The Chatter ``Msg`` envelope in both dialects, as SBS bytes.

The envelope is a fixed record of integers, booleans, strings and bytes, so it is encoded
and decoded here directly rather than through hat-sbs' generic serializer: that keeps a
small message well under hat-sbs' own cost, and lets the decoder validate what hat-sbs
does not (truncation, trailing bytes, integers past 64 bits, bad UTF-8, bad Choice
indexes). The tests check every byte against hat-sbs with ``schemas_sbs/Hat*.sbs``.
The SBS Integer reader is :mod:`wire.sbs`'s, as are String and Bytes whose length takes
more than one byte; shorter ones (type names, small payloads) are read in place here.
"""

from __future__ import annotations

import enum

import msgspec

from wire.errors import LocalProtocolError, MalformedMessage
from wire.sbs import ONE_BYTE, encode_integer, read_integer, read_string


class Dialect(enum.Enum):
    """Which envelope schema a connection speaks; the two are not wire compatible."""

    LEGACY = "Hat"
    """hat-chatter 0.5's ``Hat.Msg`` (the original Chatter): ``Data`` carries
    ``module: Optional(String)``."""

    CURRENT = "HatChatter"
    """hat-drivers chatter and today's Hat (Eventer): ``Data.type`` is the full name."""


LEGACY = Dialect.LEGACY
CURRENT = Dialect.CURRENT
"""The dialects as module globals, for the per-message paths: in Python 3.11 reading a
member off its Enum class (``Dialect.LEGACY``) goes through a descriptor, about 100 ns;
a global, about 10."""


class Msg(msgspec.Struct):
    """One Chatter message as it travels (flags from the SENDER's point of view).

    ``module`` is only meaningful in the legacy dialect (``None`` = no module); in the
    current dialect the module is part of ``type`` (``"HatEventer.MsgInitReq"``).
    Treat instances as immutable. A msgspec Struct, not a dataclass: one is built per
    message received, and a Struct is built in C (about half the cost of a slotted
    dataclass; a frozen one would double it again).
    """

    id: int
    first: int
    owner: bool
    token: bool
    last: bool
    type: str
    data: bytes
    module: str | None = None

    @property
    def starts_conversation(self) -> bool:
        """True when this message opens its conversation."""
        return self.owner and self.first == self.id


# --- Msg -------------------------------------------------------------------------------

_NONE_MODULE = b"\x80"  # Optional index 0 ('none'), None adds no bytes
_SOME_MODULE = b"\x81"  # Optional index 1 ('value')


def encode_msg(msg: Msg, dialect: Dialect) -> bytes:
    """SBS bytes of ``msg`` as ``Hat.Msg`` (legacy) or ``HatChatter.Msg`` (current)."""
    head = envelope_head(
        msg.id,
        msg.first,
        msg.owner,
        msg.token,
        msg.last,
        msg.type,
        msg.module,
        len(msg.data),
        dialect,
    )
    return head + msg.data


def envelope_head(
    msg_id: int,
    first: int,
    owner: bool,
    token: bool,
    last: bool,
    type_name: str,
    module: str | None,
    data_size: int,
    dialect: Dialect,
) -> bytes:
    """The SBS bytes of one envelope up to its data (which follows as it is), from the
    fields themselves: a sender need not build a :class:`Msg`, and a large payload is
    copied only once, when written."""
    encoded_id = encode_integer(msg_id)
    # the data's size read from the cache when it takes one byte (0..63), as encode_integer
    # would: a call less per message
    if module is None and dialect is CURRENT:  # the common case: no module field
        return b"".join(
            (
                encoded_id,
                encoded_id if first == msg_id else encode_integer(first),
                FLAGS[owner << 2 | token << 1 | last],
                TEXT_CACHE.get(type_name) or encode_text(type_name),
                ONE_BYTE[data_size + 64] if data_size < 64 else encode_integer(data_size),
            )
        )
    if module is None:
        encoded_module = _NONE_MODULE
    elif dialect is LEGACY:
        encoded_module = _SOME_MODULE + encode_text(module)
    else:
        raise LocalProtocolError("the current Chatter dialect has no module field")
    return b"".join(
        (
            encoded_id,
            encoded_id if first == msg_id else encode_integer(first),
            FLAGS[owner << 2 | token << 1 | last],
            encoded_module,
            TEXT_CACHE.get(type_name) or encode_text(type_name),
            encode_integer(data_size),
        )
    )


FLAGS = [bytes(((i >> 2) & 1, (i >> 1) & 1, i & 1)) for i in range(8)]
"""owner, token, last as three SBS Booleans, indexed by their bits."""

TEXT_CACHE: dict[str, bytes] = {}
"""SBS String bytes of the type names sent, by name (at most 4,096): read in place
(``TEXT_CACHE.get(name) or encode_text(name)``) on the per-message paths, a call less."""


def encode_text(text: str) -> bytes:
    """SBS String bytes; message type names repeat, so the common ones are cached."""
    encoded = TEXT_CACHE.get(text)
    if encoded is None:
        raw = text.encode()
        encoded = encode_integer(len(raw)) + raw
        if len(TEXT_CACHE) < 4096:
            TEXT_CACHE[text] = encoded
    return encoded


def decode_msg(buf: bytes | bytearray, start: int, end: int, dialect: Dialect) -> Msg:
    """Decode exactly ``buf[start:end]`` as one envelope; trailing bytes are an error."""
    try:
        # the two ids: read_integer's paths for two and three bytes written out (ids take
        # two from 64 on, three from 8,192); a byte past the id that is not there is a
        # truncation as read_integer's own would be, and the rest goes to read_integer
        b = buf[start]
        c = buf[start + 1]
        if b >= 0x40:  # one byte, or negative
            msg_id, pos = read_integer(buf, start)
        elif c & 0x80:
            msg_id, pos = b << 7 | c & 0x7F, start + 2
        elif buf[start + 2] & 0x80:
            msg_id, pos = b << 14 | c << 7 | buf[start + 2] & 0x7F, start + 3
        else:
            msg_id, pos = read_integer(buf, start)
        b = buf[pos]
        c = buf[pos + 1]
        if b >= 0x40:
            first, pos = read_integer(buf, pos)
        elif c & 0x80:
            first, pos = b << 7 | c & 0x7F, pos + 2
        elif buf[pos + 2] & 0x80:
            first, pos = b << 14 | c << 7 | buf[pos + 2] & 0x7F, pos + 3
        else:
            first, pos = read_integer(buf, pos)
        if pos + 3 > end:
            raise MalformedMessage("Chatter Msg truncated")
        owner = buf[pos] != 0
        token = buf[pos + 1] != 0
        last = buf[pos + 2] != 0
        pos += 3
        module = None
        if dialect is LEGACY:
            index, pos = read_integer(buf, pos)
            if index == 1:
                module, pos = read_string(buf, pos, end)
            elif index != 0:
                raise MalformedMessage(f"bad Optional index {index} in Hat.Data.module")
        # the type and the data read in place when their length takes one byte (0..63)
        size = buf[pos]
        if size & 0xC0 == 0x80:
            stop = pos + 1 + (size & 0x3F)
            if stop > end:
                raise MalformedMessage("SBS String length runs past the message")
            type_name = buf[pos + 1 : stop].decode()
            pos = stop
        else:
            type_name, pos = read_string(buf, pos, end)
        size = buf[pos]
        if size & 0xC0 == 0x80:
            pos += 1
            stop = pos + (size & 0x3F)
        else:
            size, pos = read_integer(buf, pos)
            stop = pos + size
            if size < 0:
                raise MalformedMessage("negative SBS Bytes length")
        if stop != end:
            if stop > end:
                raise MalformedMessage("SBS Bytes length runs past the message")
            raise MalformedMessage(f"{end - stop} trailing bytes after Chatter Msg")
        data = buf[pos:stop]
        if type(data) is not bytes:  # a slice of a bytearray (a frame that came in pieces)
            data = bytes(data)
    except IndexError:
        raise MalformedMessage("Chatter Msg truncated") from None
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"Chatter string is not UTF-8: {exc.reason}") from None
    if msg_id < 0 or first < 0:
        raise MalformedMessage("negative Chatter message id")
    return Msg(msg_id, first, owner, token, last, type_name, data, module)


def detect_dialect(buf: bytes | bytearray, start: int, end: int) -> tuple[Dialect, Msg]:
    """Tell the dialect from one whole frame body: only one schema decodes it completely.

    Should both decode it (no real message does), the current dialect wins.
    """
    errors = []
    for dialect in (Dialect.CURRENT, Dialect.LEGACY):
        try:
            return dialect, decode_msg(buf, start, end, dialect)
        except MalformedMessage as exc:
            errors.append(f"{dialect.value}: {exc}")
    raise MalformedMessage("first frame is neither dialect (" + "; ".join(errors) + ")")

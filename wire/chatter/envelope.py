"""The Chatter ``Msg`` envelope in both dialects, as SBS bytes.

The envelope is a fixed record of integers, booleans, strings and bytes, so it is encoded
and decoded here directly rather than through hat-sbs' generic serializer: that keeps a
small message well under hat-sbs' own cost, and lets the decoder validate what hat-sbs
does not (truncation, trailing bytes, integers past 64 bits, bad UTF-8, bad Choice
indexes). The tests check every byte against hat-sbs with ``schemas_sbs/Hat*.sbs``.

SBS Integer: big-endian 7-bit groups, bit 7 set on the LAST byte, bit 6 of the first byte
is the two's-complement sign, minimal length.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from wire.errors import LocalProtocolError, MalformedMessage

MAX_INTEGER_BYTES = 10
"""Longest SBS Integer accepted (70 bits covers int64; hat-sbs' C decoder wraps past it)."""


class Dialect(enum.Enum):
    """Which envelope schema a connection speaks; the two are not wire compatible."""

    LEGACY = "Hat"
    """Seeds 000/001 and hat-chatter 0.5: ``Data`` carries ``module: Optional(String)``."""

    CURRENT = "HatChatter"
    """hat-drivers chatter and today's Hat (Eventer): ``Data.type`` is the full name."""


@dataclass(slots=True)
class Msg:
    """One Chatter message as it travels (flags from the SENDER's point of view).

    ``module`` is only meaningful in the legacy dialect (``None`` = no module); in the
    current dialect the module is part of ``type`` (``"HatEventer.MsgInitReq"``).
    Treat instances as immutable; they are not frozen only because that halves the cost
    of building one on the hot path.
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


# --- Integer ---------------------------------------------------------------------------

_ONE_BYTE = [bytes(((n & 0x7F) | 0x80,)) for n in range(-64, 64)]


def encode_integer(n: int) -> bytes:
    """SBS Integer bytes of ``n`` (minimal length)."""
    if -64 <= n < 64:
        return _ONE_BYTE[n + 64]
    if 0 < n < 0x2000:  # ids: 2, 3 and 4 groups without the loop
        return bytes((n >> 7, (n & 0x7F) | 0x80))
    if 0 < n < 0x100000:
        return bytes((n >> 14, (n >> 7) & 0x7F, (n & 0x7F) | 0x80))
    if 0 < n < 0x8000000:
        return bytes((n >> 21, (n >> 14) & 0x7F, (n >> 7) & 0x7F, (n & 0x7F) | 0x80))
    groups = bytearray()
    while True:
        groups.append(n & 0x7F)
        n >>= 7
        if (n == 0 and not groups[-1] & 0x40) or (n == -1 and groups[-1] & 0x40):
            break
    groups[0] |= 0x80
    groups.reverse()
    return bytes(groups)


def _read_integer(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    """Read an SBS Integer at ``pos``; return (value, next position).

    Raises IndexError on truncation (the caller turns it into MalformedMessage).
    """
    b = buf[pos]
    value = b & 0x7F
    if value & 0x40:
        value -= 0x80
    if b & 0x80:
        return value, pos + 1
    end = pos + MAX_INTEGER_BYTES
    pos += 1
    while True:
        if pos >= end:
            raise MalformedMessage("SBS Integer longer than 10 bytes")
        b = buf[pos]
        pos += 1
        value = (value << 7) | (b & 0x7F)
        if b & 0x80:
            return value, pos


def _read_blob(buf: bytes | bytearray, pos: int, end: int) -> tuple[bytes, int]:
    size, pos = _read_integer(buf, pos)
    stop = pos + size
    if size < 0 or stop > end:
        raise MalformedMessage("SBS Bytes/String length runs past the message")
    return bytes(buf[pos:stop]), stop


# --- Msg -------------------------------------------------------------------------------

_NONE_MODULE = b"\x80"  # Optional index 0 ('none'), None adds no bytes
_SOME_MODULE = b"\x81"  # Optional index 1 ('value')


def encode_msg(msg: Msg, dialect: Dialect) -> bytes:
    """SBS bytes of ``msg`` as ``Hat.Msg`` (legacy) or ``HatChatter.Msg`` (current)."""
    return b"".join(encode_msg_parts(msg, dialect))


def encode_msg_parts(msg: Msg, dialect: Dialect) -> list[bytes]:
    """:func:`encode_msg` as a list of pieces, so a large payload is copied only once."""
    data = msg.data
    if dialect is Dialect.LEGACY:
        module = _NONE_MODULE if msg.module is None else _SOME_MODULE + _encode_text(msg.module)
    elif msg.module is not None:
        raise LocalProtocolError("the current Chatter dialect has no module field")
    else:
        module = b""
    return [
        encode_integer(msg.id),
        encode_integer(msg.first),
        _FLAGS[msg.owner << 2 | msg.token << 1 | msg.last],
        module,
        _encode_text(msg.type),
        encode_integer(len(data)),
        data,
    ]


_FLAGS = [bytes(((i >> 2) & 1, (i >> 1) & 1, i & 1)) for i in range(8)]
"""owner, token, last as three SBS Booleans, indexed by their bits."""

_TEXT_CACHE: dict[str, bytes] = {}


def _encode_text(text: str) -> bytes:
    """SBS String bytes; message type names repeat, so the common ones are cached."""
    encoded = _TEXT_CACHE.get(text)
    if encoded is None:
        raw = text.encode()
        encoded = encode_integer(len(raw)) + raw
        if len(_TEXT_CACHE) < 4096:
            _TEXT_CACHE[text] = encoded
    return encoded


def decode_msg(buf: bytes | bytearray, start: int, end: int, dialect: Dialect) -> Msg:
    """Decode exactly ``buf[start:end]`` as one envelope; trailing bytes are an error."""
    try:
        msg_id, pos = _read_integer(buf, start)
        first, pos = _read_integer(buf, pos)
        if pos + 3 > end:
            raise MalformedMessage("Chatter Msg truncated")
        owner = buf[pos] != 0
        token = buf[pos + 1] != 0
        last = buf[pos + 2] != 0
        pos += 3
        module = None
        if dialect is Dialect.LEGACY:
            index, pos = _read_integer(buf, pos)
            if index == 1:
                raw, pos = _read_blob(buf, pos, end)
                module = raw.decode()
            elif index != 0:
                raise MalformedMessage(f"bad Optional index {index} in Hat.Data.module")
        raw_type, pos = _read_blob(buf, pos, end)
        data, pos = _read_blob(buf, pos, end)
        type_name = raw_type.decode()
    except IndexError:
        raise MalformedMessage("Chatter Msg truncated") from None
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"Chatter string is not UTF-8: {exc.reason}") from None
    if pos != end:
        raise MalformedMessage(f"{end - pos} trailing bytes after Chatter Msg")
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

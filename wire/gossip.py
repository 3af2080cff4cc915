"""Sans-I/O codec for the gossip broadcast frame of Chatter, the Elixir broadcast library.

(Chatter v0.0.15 on the wire.)

The layout follows what the reference code emits, not its documentation's prose (which swaps the
checksum and size fields and hashes the compressed bytes)::

    msg    = 0xff | VarInt(len(ct)) | ct
    ct     = AES-256-CTR(key, initial counter block b"-- ScaleSmall --") over pt
    pt     = pad[32] | u32be xxh32(gossip, seed 0) | VarInt(len(gossip)) | snappy_raw(gossip)
    gossip = NetID table | current BroadcastID | [seen BroadcastIDs] | [other NetID refs]
             | [distribution NetID refs] | VarInt payload tag | payload bytes

Security: every message restarts the same CTR keystream and there is no MAC, so anyone who
knows one plaintext can read or forge messages. We speak this frame for compatibility only;
the xxh32 checksum detects corruption and wrong keys, not attackers.

Checks we add beyond the reference's decoder, each raising
:class:`~wire.errors.MalformedMessage` or :class:`~wire.errors.MessageTooLarge` (no frame the
reference encoder writes fails them):

- VarInts longer than 10 bytes or >= 2**64; payload tags >= 2**32 (tags are xxh32 values).
- The plaintext size field must equal snappy's own length prefix (the reference ignores it)
  and so the gossip's real length.
- Both lengths are bounded by ``max_size`` before anything is decompressed or buffered.
- Bytes after the end of a frame (:func:`decode_frame`) or of the snappy block are errors.
- The NetID table must be sorted and de-duplicated, as the reference writes it: payloads may
  refer to it by index, so we cannot re-sort it (see :class:`Gossip`).
- A stream is framed by start byte + VarInt length (the reference assumes one read = one
  message, which breaks on merged or split TCP reads).

We stay as liberal as the reference where it costs nothing: table entries nothing in the
gossip references are kept (a payload may use them), and VarInts may carry redundant zero
groups (within 10 bytes).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

import cramjam
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from wire import DEFAULT_MAX_SIZE
from wire.errors import LocalProtocolError, MalformedMessage, MessageTooLarge, ProtocolError

__all__ = [
    "KEY_FILLER",
    "START_BYTE",
    "BroadcastID",
    "Gossip",
    "GossipCodec",
    "NetID",
    "decode_frame",
    "decode_gossip",
    "decode_varint",
    "derive_key",
    "encode_frame",
    "encode_gossip",
    "encode_varint",
    "payload_tag",
]

BytesLike: TypeAlias = bytes | bytearray | memoryview

START_BYTE = 0xFF
"""First byte of every message (the documentation's "SOM")."""

KEY_FILLER = b"01234567890123456789012345678901"
"""Appended to keys that are not exactly 32 bytes long, then the result is cut to 32."""

PADDING_SIZE = 32
"""Random bytes in front of the plaintext; with a reused keystream they only hide the pad."""

_IV = b"-- ScaleSmall --"
_U64_LIMIT = 1 << 64
_U32_LIMIT = 1 << 32
_MAX_VARINT_BYTES = 10  # ceil(64 / 7): enough for any u64
_MAX_HEADER = 1 + _MAX_VARINT_BYTES
# Padding, checksum, a one-byte size and a one-byte snappy block: anything shorter is garbage,
# so the stream reader can reject it from the header (and never holds an empty body).
_MIN_CT = PADDING_SIZE + 4 + 1 + 1


# --- VarInt ---------------------------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128, as the reference writes it; only u64 values, since we read no more."""
    if not 0 <= n < _U64_LIMIT:
        raise LocalProtocolError(f"VarInt out of range 0..2**64-1: {n}")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_varint(buf: BytesLike, offset: int = 0) -> tuple[int, int]:
    """Read one VarInt at ``offset``; return ``(value, offset after it)``.

    Bounded at 10 bytes and 2**64 so a hostile peer cannot make us build huge integers.
    """
    if offset < 0:
        raise ValueError("offset must not be negative")
    end = len(buf)
    if offset >= end:
        raise MalformedMessage("truncated VarInt")
    byte = buf[offset]
    if byte < 0x80:
        return byte, offset + 1
    value = byte & 0x7F
    shift = 7
    pos = offset + 1
    while True:
        if pos >= end:
            raise MalformedMessage("truncated VarInt")
        if pos - offset >= _MAX_VARINT_BYTES:
            raise MalformedMessage("over-long VarInt (more than 10 bytes)")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
    if value >= _U64_LIMIT:
        raise MalformedMessage("VarInt value does not fit in 64 bits")
    return value, pos


# --- Messages -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NetID:
    """A node's IPv4 address and port; orders by (a, b, c, d, port) like the wire table."""

    host: str
    port: int
    _packed: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str):
            raise TypeError(f"host must be a dotted IPv4 string, not {type(self.host).__name__}")
        try:
            address = ipaddress.IPv4Address(self.host)
        except ipaddress.AddressValueError as exc:
            raise ValueError(f"not an IPv4 address: {self.host!r}") from exc
        if not isinstance(self.port, int) or not 0 <= self.port <= 0xFFFF:
            raise ValueError(f"port out of range 0..65535: {self.port!r}")
        object.__setattr__(self, "host", str(address))
        object.__setattr__(self, "_packed", address.packed + self.port.to_bytes(2, "big"))

    @classmethod
    def from_packed(cls, data: BytesLike) -> NetID:
        """Build from the 6 wire bytes; skips re-parsing the host since 4 bytes are always valid."""
        if len(data) != 6:
            raise ValueError("a packed NetID is exactly 6 bytes")
        return _trusted_netid(bytes(data))

    @property
    def packed(self) -> bytes:
        """The 6 wire bytes: IPv4 address, then big-endian port."""
        return self._packed

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed < other._packed

    def __le__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed <= other._packed

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed > other._packed

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, NetID):
            return NotImplemented
        return self._packed >= other._packed


@dataclass(frozen=True, slots=True)
class BroadcastID:
    """Who sent a gossip and its per-sender sequence number (bumped per broadcast)."""

    origin: NetID
    seq: int

    def __post_init__(self) -> None:
        if not isinstance(self.origin, NetID):
            raise TypeError("origin must be a NetID")
        if not isinstance(self.seq, int) or not 0 <= self.seq < _U64_LIMIT:
            raise ValueError(f"seq out of range 0..2**64-1: {self.seq!r}")


def _packed_key(netid: NetID) -> bytes:
    return netid.packed


def _netids(values: Iterable[NetID], name: str) -> tuple[NetID, ...]:
    result = tuple(values)
    for value in result:
        if not isinstance(value, NetID):
            raise TypeError(f"{name} must hold NetID values, got {type(value).__name__}")
    return result


@dataclass(frozen=True, slots=True)
class Gossip:
    """One message: the broadcast metadata the distribution tree needs, plus the user payload.

    ``seen``: BroadcastIDs the sender saw over multicast; ``others``: a few random nodes, so
    distant groups learn of each other; ``distribution``: who the receiver must forward to.
    ``tag`` is :func:`payload_tag` of the payload's type name.

    ``table`` is the wire's NetID table, always sorted and de-duplicated: every NetID the
    fields above reference, plus any given here. It exists because reference payloads refer
    to NetIDs by table index too (a ``broadcast_id`` payload is ``VarInt index, VarInt seq``):
    pass such NetIDs in ``table`` and write the payload with :meth:`ref`, or resolve a decoded
    payload's indices with ``g.table[i]``. Sequences become tuples.
    """

    current: BroadcastID
    seen: tuple[BroadcastID, ...] = ()
    others: tuple[NetID, ...] = ()
    distribution: tuple[NetID, ...] = ()
    tag: int = 0
    payload: bytes = b""
    table: tuple[NetID, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.current, BroadcastID):
            raise TypeError("current must be a BroadcastID")
        seen = tuple(self.seen)
        for value in seen:
            if not isinstance(value, BroadcastID):
                raise TypeError(f"seen must hold BroadcastID values, got {type(value).__name__}")
        others = _netids(self.others, "others")
        distribution = _netids(self.distribution, "distribution")
        extra = _netids(self.table, "table")
        if not isinstance(self.tag, int) or not 0 <= self.tag < _U32_LIMIT:
            raise ValueError(f"tag out of range 0..2**32-1 (an xxh32 value): {self.tag!r}")
        if not isinstance(self.payload, bytes):
            if not isinstance(self.payload, bytearray | memoryview):
                raise TypeError("payload must be bytes")
            object.__setattr__(self, "payload", bytes(self.payload))
        table = tuple(
            sorted(
                {self.current.origin, *(b.origin for b in seen), *others, *distribution, *extra},
                key=_packed_key,
            )
        )
        object.__setattr__(self, "seen", seen)
        object.__setattr__(self, "others", others)
        object.__setattr__(self, "distribution", distribution)
        object.__setattr__(self, "table", table)

    def ref(self, netid: NetID) -> int:
        """Table index of ``netid``, for payloads that refer to NetIDs (ValueError if absent)."""
        return self.table.index(netid)


def payload_tag(type_name: str) -> int:
    """The wire tag of a payload type: xxh32 of its UTF-8 name, seed 0 ("hello" -> 4211111929)."""
    return xxhash.xxh32_intdigest(type_name.encode("utf-8"), seed=0)


def derive_key(key: BytesLike) -> bytes:
    """The reference's key rule: 32 bytes as is, else pad with :data:`KEY_FILLER` and cut."""
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError("key must be bytes")
    key = bytes(key)
    if len(key) == 32:
        return key
    return (key + KEY_FILLER)[:32]


# --- Gossip body ----------------------------------------------------------------------------


def encode_gossip(g: Gossip) -> bytes:
    """The uncompressed gossip, with ``g.table`` (sorted, de-duplicated) as the NetID table."""
    table = g.table
    index = {netid: i for i, netid in enumerate(table)}
    varint = encode_varint
    parts = [varint(len(table))]
    parts.extend(netid.packed for netid in table)
    parts.append(varint(index[g.current.origin]))
    parts.append(varint(g.current.seq))
    parts.append(varint(len(g.seen)))
    for bid in g.seen:
        parts.append(varint(index[bid.origin]))
        parts.append(varint(bid.seq))
    for refs in (g.others, g.distribution):
        parts.append(varint(len(refs)))
        parts.extend(varint(index[netid]) for netid in refs)
    parts.append(varint(g.tag))
    parts.append(g.payload)
    return b"".join(parts)


# Decoding is the hot path, and its own checks (table sorted, indices in range, VarInt bounds)
# already guarantee what the constructors would re-check: build its results without them.
_set = object.__setattr__


def _trusted_netid(packed: bytes) -> NetID:
    netid = object.__new__(NetID)
    _set(netid, "host", f"{packed[0]}.{packed[1]}.{packed[2]}.{packed[3]}")
    _set(netid, "port", (packed[4] << 8) | packed[5])
    _set(netid, "_packed", packed)
    return netid


def _trusted_bid(origin: NetID, seq: int) -> BroadcastID:
    bid = object.__new__(BroadcastID)
    _set(bid, "origin", origin)
    _set(bid, "seq", seq)
    return bid


def _read_ref(table: list[NetID], data: bytes, off: int) -> tuple[NetID, int]:
    index, off = decode_varint(data, off)
    if index >= len(table):
        raise MalformedMessage(f"NetID index {index} out of range (table has {len(table)})")
    return table[index], off


def _read_bid(table: list[NetID], data: bytes, off: int) -> tuple[BroadcastID, int]:
    origin, off = _read_ref(table, data, off)
    seq, off = decode_varint(data, off)
    return _trusted_bid(origin, seq), off


def _read_count(data: bytes, off: int, min_entry: int, what: str) -> tuple[int, int]:
    """Read a list count and reject it before allocating if the entries cannot fit."""
    count, off = decode_varint(data, off)
    if count * min_entry > len(data) - off:
        raise MalformedMessage(f"{what} count {count} does not fit in the remaining bytes")
    return count, off


def decode_gossip(data: BytesLike) -> Gossip:
    """Parse an uncompressed gossip; the payload is whatever follows the tag."""
    data = bytes(data)
    count, off = _read_count(data, 0, 6, "NetID table")
    table: list[NetID] = []
    previous = b""
    for i in range(off, off + 6 * count, 6):
        packed = data[i : i + 6]
        # Payloads may hold table indices, so a table we would re-sort cannot be accepted.
        if packed <= previous:
            raise MalformedMessage("NetID table is not sorted and de-duplicated")
        table.append(_trusted_netid(packed))
        previous = packed
    off += 6 * count

    current, off = _read_bid(table, data, off)
    count, off = _read_count(data, off, 2, "seen BroadcastID")
    seen = []
    for _ in range(count):
        bid, off = _read_bid(table, data, off)
        seen.append(bid)
    refs: list[list[NetID]] = [[], []]
    for what, out in zip(("other NetID", "distribution NetID"), refs, strict=True):
        count, off = _read_count(data, off, 1, what)
        for _ in range(count):
            netid, off = _read_ref(table, data, off)
            out.append(netid)
    tag, off = decode_varint(data, off)
    if tag >= _U32_LIMIT:
        raise MalformedMessage(f"payload tag {tag} is not a 32-bit xxh32 value")

    g = object.__new__(Gossip)
    _set(g, "current", current)
    _set(g, "seen", tuple(seen))
    _set(g, "others", tuple(refs[0]))
    _set(g, "distribution", tuple(refs[1]))
    _set(g, "tag", tag)
    _set(g, "payload", data[off:])
    _set(g, "table", tuple(table))
    return g


# --- Frame ----------------------------------------------------------------------------------


def _cipher(key: BytesLike) -> Cipher[modes.CTR]:
    # One Cipher per key; every encryptor()/decryptor() restarts the counter, as the reference.
    return Cipher(algorithms.AES256(derive_key(key)), modes.CTR(_IV))


def _seal(cipher: Cipher[modes.CTR], gossip: bytes, padding: BytesLike | None) -> bytes:
    pad = os.urandom(PADDING_SIZE) if padding is None else bytes(padding)
    if len(pad) != PADDING_SIZE:
        raise LocalProtocolError(f"padding must be exactly {PADDING_SIZE} bytes")
    checksum = xxhash.xxh32_intdigest(gossip, seed=0).to_bytes(4, "big")
    compressed = cramjam.snappy.compress_raw(gossip)
    head = b"".join((pad, checksum, encode_varint(len(gossip))))
    # CTR is a stream: encrypt the two plaintext pieces in turn instead of joining them first,
    # and join the header with the ciphertext once (big messages: one copy fewer).
    encryptor = cipher.encryptor()
    ct_head = encryptor.update(head)
    ct_body = encryptor.update(compressed)
    encryptor.finalize()
    length = encode_varint(len(ct_head) + len(ct_body))
    return b"".join((b"\xff", length, ct_head, ct_body))


def _open(cipher: Cipher[modes.CTR], ciphertext: BytesLike, max_size: int) -> Gossip:
    """Decrypt, bound, decompress, verify and parse one body (the bytes after the header)."""
    if len(ciphertext) < _MIN_CT:
        raise MalformedMessage(f"encrypted content of {len(ciphertext)} bytes is too short")
    decryptor = cipher.decryptor()
    plaintext = decryptor.update(ciphertext) + decryptor.finalize()
    checksum = int.from_bytes(plaintext[PADDING_SIZE : PADDING_SIZE + 4], "big")
    size, off = decode_varint(plaintext, PADDING_SIZE + 4)
    if size > max_size:
        raise MessageTooLarge(f"gossip of {size} bytes exceeds max_size {max_size}")
    # Snappy's raw block starts with its own uncompressed length: it sizes the allocation,
    # so it must agree with the (bounded) size field before we decompress anything.
    announced, _ = decode_varint(plaintext, off)
    if announced != size:
        raise MalformedMessage(f"size field {size} disagrees with snappy's length {announced}")
    try:
        gossip = bytes(cramjam.snappy.decompress_raw(memoryview(plaintext)[off:]))
    except cramjam.DecompressionError as exc:
        raise MalformedMessage(f"bad snappy block (wrong key?): {exc}") from None
    if len(gossip) != size:
        raise MalformedMessage("decompressed length disagrees with the size field")
    if xxhash.xxh32_intdigest(gossip, seed=0) != checksum:
        raise MalformedMessage("checksum mismatch (corrupt message or wrong key)")
    return decode_gossip(gossip)


def encode_frame(g: Gossip, key: BytesLike, *, padding: BytesLike | None = None) -> bytes:
    """One whole message, start byte included; ``padding`` (32 bytes) defaults to random."""
    return _seal(_cipher(key), encode_gossip(g), padding)


def decode_frame(data: BytesLike, key: BytesLike, *, max_size: int = DEFAULT_MAX_SIZE) -> Gossip:
    """Decode exactly one whole message (e.g. a UDP datagram); extra or missing bytes are errors."""
    if not data or data[0] != START_BYTE:
        raise MalformedMessage("message does not start with 0xff")
    length, off = decode_varint(data, 1)
    if length > max_size:
        raise MessageTooLarge(f"message of {length} bytes exceeds max_size {max_size}")
    if len(data) - off != length:
        raise MalformedMessage(f"header announces {length} bytes, {len(data) - off} present")
    return _open(_cipher(key), memoryview(data)[off:], max_size)


# --- Stream codec ---------------------------------------------------------------------------


class GossipCodec:
    """Frames gossip over a byte stream (TCP), where reads split and merge messages freely.

    Each frame is cut by its start byte and VarInt length; a length above ``max_size`` is
    refused from the header, so at most ``11 + max_size`` bytes are ever buffered. After any
    :class:`ProtocolError` the stream is out of sync for good and every later call raises.
    """

    __slots__ = ("_body", "_body_len", "_cipher", "_error", "_header", "_max_size")

    def __init__(self, key: BytesLike, *, max_size: int = DEFAULT_MAX_SIZE) -> None:
        if max_size < 0:
            raise ValueError("max_size must not be negative")
        self._cipher = _cipher(key)
        self._max_size = max_size
        self._header = bytearray()  # start byte + VarInt bytes of the frame being read
        self._body = bytearray()  # ciphertext bytes of the frame being read
        self._body_len: int | None = None  # set once the header is complete
        self._error: ProtocolError | None = None

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame (never above ``11 + max_size``)."""
        return len(self._header) + len(self._body)

    def send(self, gossip: Gossip, padding: BytesLike | None = None) -> bytes:
        """Encode one frame; refuse one a peer with our ``max_size`` would reject."""
        body = encode_gossip(gossip)
        if len(body) > self._max_size:
            raise LocalProtocolError(f"gossip of {len(body)} bytes exceeds max_size")
        frame = _seal(self._cipher, body, padding)
        length, _ = decode_varint(frame, 1)
        if length > self._max_size:
            raise LocalProtocolError(f"message of {length} bytes exceeds max_size")
        return frame

    def receive_data(self, data: BytesLike) -> list[Gossip]:
        """Feed bytes as they arrive; return the messages they complete, in order.

        On an error, messages completed earlier in the same call are dropped with the stream.
        """
        self._check_alive()
        try:
            return self._receive(memoryview(data).cast("B"))
        except ProtocolError as exc:
            self._error = exc
            raise

    def receive_eof(self) -> None:
        """The peer closed the stream; raise if it stopped in the middle of a message."""
        self._check_alive()
        if self.buffered:
            self._error = MalformedMessage("stream ended inside a message")
            raise self._error

    def _check_alive(self) -> None:
        if self._error is not None:
            raise type(self._error)(f"stream already failed: {self._error}")

    def _receive(self, view: memoryview) -> list[Gossip]:
        out: list[Gossip] = []
        pos = 0
        end = len(view)
        while pos < end:
            if self._body_len is None:
                pos = self._read_header(view, pos)
                continue
            need = self._body_len - len(self._body)
            take = min(need, end - pos)
            if take == need and not self._body:
                body: BytesLike = view[pos : pos + take]  # whole body in this chunk: no copy
            else:
                self._body += view[pos : pos + take]
                body = self._body
            pos += take
            if take == need:
                out.append(_open(self._cipher, body, self._max_size))
                self._body = bytearray()
                self._body_len = None
        return out

    def _read_header(self, view: memoryview, pos: int) -> int:
        """Take header bytes one at a time (at most 11 per frame) until the VarInt ends."""
        byte = view[pos]
        header = self._header
        if not header and byte != START_BYTE:
            raise MalformedMessage(f"message starts with {byte:#04x}, not 0xff")
        header.append(byte)
        if len(header) == 1 or byte & 0x80:
            if len(header) >= _MAX_HEADER:
                raise MalformedMessage("over-long VarInt (more than 10 bytes)")
            return pos + 1
        length, _ = decode_varint(header, 1)
        if length > self._max_size:
            raise MessageTooLarge(f"message of {length} bytes exceeds max_size {self._max_size}")
        if length < _MIN_CT:
            raise MalformedMessage(f"encrypted content of {length} bytes is too short")
        header.clear()
        self._body_len = length
        return pos + 1

"""The encrypted frame (``0xff | VarInt length | AES-256-CTR(...)``) and its stream codec."""

from __future__ import annotations

import os

import cramjam
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from wire import DEFAULT_MAX_SIZE
from wire.errors import LocalProtocolError, MalformedMessage, MessageTooLarge, ProtocolError
from wire.gossip.body import DEFAULT_MAX_NETIDS, decode_gossip, encode_gossip
from wire.gossip.messages import Gossip
from wire.gossip.varint import MAX_VARINT_BYTES, BytesLike, decode_varint, encode_varint

START_BYTE = 0xFF
"""First byte of every message (the documentation's "SOM")."""

KEY_FILLER = b"01234567890123456789012345678901"
"""Appended to keys that are not exactly 32 bytes long, then the result is cut to 32."""

PADDING_SIZE = 32
"""Random bytes in front of the plaintext; with a reused keystream they only hide the pad."""

_IV = b"-- ScaleSmall --"
_MAX_HEADER = 1 + MAX_VARINT_BYTES
# Padding, checksum, a one-byte size and a one-byte snappy block: anything shorter is garbage,
# so the stream reader can reject it from the header (and never holds an empty body).
_MIN_CT = PADDING_SIZE + 4 + 1 + 1


def derive_key(key: BytesLike) -> bytes:
    """The reference's key rule: 32 bytes as is, else pad with :data:`KEY_FILLER` and cut."""
    if not isinstance(key, bytes | bytearray | memoryview):
        raise TypeError("key must be bytes")
    key = bytes(key)
    if len(key) == 32:
        return key
    return (key + KEY_FILLER)[:32]


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
    ct_body = encryptor.update(memoryview(compressed))  # cramjam's Buffer, not copied
    encryptor.finalize()
    length = encode_varint(len(ct_head) + len(ct_body))
    return b"".join((b"\xff", length, ct_head, ct_body))


def _open(
    cipher: Cipher[modes.CTR], ciphertext: BytesLike, max_size: int, max_netids: int
) -> Gossip:
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
    return decode_gossip(gossip, max_netids=max_netids)


def payload_fits(payload: BytesLike, overhead: int, max_size: int) -> bool:
    """Whether a frame carrying ``payload`` and at most ``overhead`` other gossip bytes
    (table, lists, tag) stays within ``max_size``, as gossip and once compressed and sealed.

    Snappy grows incompressible data (random bytes: about 3 bytes per 64 KiB, 772 for
    16 MiB; its worst case is a sixth), so a payload a few hundred bytes under the limit
    can make a frame over it. The payload is compressed here only when that worst case
    could pass ``max_size``; ``overhead`` is counted as incompressible.
    """
    body = len(payload) + overhead
    if body > max_size:
        return False
    sealed = PADDING_SIZE + 4 + MAX_VARINT_BYTES  # padding, checksum, size field

    def worst(n: int) -> int:  # snappy's MaxCompressedLength
        return 32 + n + n // 6

    if sealed + worst(body) <= max_size:
        return True
    grown = len(cramjam.snappy.compress_raw(payload)) - len(payload)
    return sealed + max(grown, 0) + len(payload) + worst(overhead) + 64 <= max_size


def encode_frame(g: Gossip, key: BytesLike, *, padding: BytesLike | None = None) -> bytes:
    """One whole message, start byte included; ``padding`` (32 bytes) defaults to random."""
    return _seal(_cipher(key), encode_gossip(g), padding)


def decode_frame(
    data: BytesLike,
    key: BytesLike,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
    max_netids: int = DEFAULT_MAX_NETIDS,
) -> Gossip:
    """Decode exactly one whole message (e.g. a UDP datagram); extra or missing bytes are errors.

    ``max_size`` bounds the message and its gossip (16 MiB), ``max_netids`` the gossip's
    NetID table (8192; see :func:`~wire.gossip.decode_gossip`).
    """
    if not data or data[0] != START_BYTE:
        raise MalformedMessage("message does not start with 0xff")
    length, off = decode_varint(data, 1)
    if length > max_size:
        raise MessageTooLarge(f"message of {length} bytes exceeds max_size {max_size}")
    if len(data) - off != length:
        raise MalformedMessage(f"header announces {length} bytes, {len(data) - off} present")
    return _open(_cipher(key), memoryview(data)[off:], max_size, max_netids)


class GossipCodec:
    """Frames gossip over a byte stream (TCP), where reads split and merge messages freely.

    Each frame is cut by its start byte and VarInt length; a length above ``max_size`` is
    refused from the header, so at most ``11 + max_size`` bytes are ever buffered; a gossip
    whose NetID table holds more than ``max_netids`` entries (default 8192) is refused too.
    After any :class:`ProtocolError` the stream is out of sync for good and every later
    call raises.
    """

    __slots__ = ("_body", "_body_len", "_cipher", "_error", "_header", "_max_netids", "_max_size")

    def __init__(
        self,
        key: BytesLike,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        max_netids: int = DEFAULT_MAX_NETIDS,
    ) -> None:
        if max_size < 0 or max_netids < 0:
            raise ValueError("max_size and max_netids must not be negative")
        self._cipher = _cipher(key)
        self._max_size = max_size
        self._max_netids = max_netids
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

    @property
    def max_netids(self) -> int:
        return self._max_netids

    def send(self, gossip: Gossip, padding: BytesLike | None = None) -> bytes:
        """Encode one frame; refuse one a peer with our limits would reject."""
        if len(gossip.table) > self._max_netids:
            raise LocalProtocolError(
                f"NetID table of {len(gossip.table)} entries exceeds max_netids"
            )
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
                out.append(_open(self._cipher, body, self._max_size, self._max_netids))
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

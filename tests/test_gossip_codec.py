"""Gossip frame codec: the reference test vectors byte for byte, then every rejection path."""

from __future__ import annotations

from typing import NamedTuple

import cramjam
import pytest
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from wire import DEFAULT_MAX_SIZE
from wire.errors import LocalProtocolError, MalformedMessage, MessageTooLarge, ProtocolError
from wire.gossip import (
    BroadcastID,
    Gossip,
    GossipCodec,
    NetID,
    decode_frame,
    decode_gossip,
    decode_varint,
    derive_key,
    encode_frame,
    encode_gossip,
    encode_varint,
    payload_tag,
)

ZERO_PAD = bytes(32)
IV = b"-- ScaleSmall --"

# Vectors from the notes (gossip-vectors.txt), cross-checked there against the Elixir reference.
V1_KEY = b"01234567890123456789012345678901"
V1_GOSSIP = bytes.fromhex(
    "037f000001752f7f00000175317f000001753200010000020102f9ef81d80f776f726c64"
)
V1_XXH32 = 692022943
V1_SNAPPY = bytes.fromhex("2418037f000001752f050600310506443200010000020102f9ef81d80f776f726c64")
V1_PLAINTEXT = ZERO_PAD + bytes.fromhex(
    "293f6e9f242418037f000001752f050600310506443200010000020102f9ef81d80f776f726c64"
)
V1_KEYSTREAM = bytes.fromhex(
    "9d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f79821"
    "76134511704e79354d1cd4ad1e5019eb1e13004d53d9ea192d9a951d8935778eae5ce5f738bc4f"
)
V1_MESSAGE = bytes.fromhex(
    "ff479d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f798215f2c2b8e546a6136"
    "321cd4ac6b7f1ced1e22054b17ebea182d9a971c8bcc980f765392984ad02b"
)
# Same gossip and key, laid out as the protocol's prose description says (size, then xxh32
# of the COMPRESSED bytes): the reference rejects it, so must we.
V1_DOC_MESSAGE = bytes.fromhex(
    "ff479d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f798215200304f1e6a6136"
    "321cd4ac6b7f1ced1e22054b17ebea182d9a971c8bcc980f765392984ad02b"
)

V2_KEY = b"secret"
V2_GOSSIP = bytes.fromhex(
    "04010203040001c0a80161752fc0a80164752fc0a80186752f01040202030301010203010203a5e29cf903006f"
)
V2_XXH32 = 3457015744
V2_SNAPPY = bytes.fromhex(
    "2d4004010203040001c0a80161752fc0a8016405065886752f01040202030301010203010203a5e29cf903006f"
)
V2_PLAINTEXT = ZERO_PAD + bytes.fromhex(
    "ce0ddfc02d2d4004010203040001c0a80161752fc0a8016405065886752f01040202030301010203010203"
    "a5e29cf903006f"
)
V2_KEYSTREAM = bytes.fromhex(
    "42b539cacaf7f987e55f4c399f98d26e96730f62a89920bd984b1bf30bb50af2a9b3efb6087af8ebab1e1a29"
    "e3a371dfe7dbc560775d7ef18a23fd7e50be63ea51faae98147683a2514edc76096717eb4112"
)
V2_MESSAGE = bytes.fromhex(
    "ff5242b539cacaf7f987e55f4c399f98d26e96730f62a89920bd984b1bf30bb50af267be30762557b8efaa"
    "1c192de3a2b177e6bab04fb7f57f958f25a5f8259162ee53f8ad9b157781a1504cdfd3ebfbeee8417d"
)

N_29999 = NetID("127.0.0.1", 29999)
N_30001 = NetID("127.0.0.1", 30001)
N_30002 = NetID("127.0.0.1", 30002)
V1 = Gossip(
    current=BroadcastID(N_29999, 1),
    seen=(),
    others=(),
    distribution=(N_30001, N_30002),
    tag=4211111929,
    payload=b"world",
)

N_1234 = NetID("1.2.3.4", 1)
N_97 = NetID("192.168.1.97", 29999)
N_100 = NetID("192.168.1.100", 29999)
N_134 = NetID("192.168.1.134", 29999)
V2 = Gossip(
    current=BroadcastID(N_97, 4),
    seen=(BroadcastID(N_100, 3), BroadcastID(N_134, 1)),
    others=(N_100,),
    distribution=(N_97, N_100, N_134),
    tag=1059533093,
    payload=b"\x00\x6f",  # a broadcast_id payload: NetID table index 0 (1.2.3.4:1), seq 111
    table=(N_1234,),
)


def _aes_ctr(key32: bytes, data: bytes) -> bytes:
    """Independent of the codec: the reference's cipher, built straight from cryptography."""
    enc = Cipher(algorithms.AES(key32), modes.CTR(IV)).encryptor()
    return enc.update(data) + enc.finalize()


def _frame(plaintext: bytes, key: bytes) -> bytes:
    """A frame around an arbitrary plaintext, to reach checks past the cipher."""
    ct = _aes_ctr(derive_key(key), plaintext)
    return b"\xff" + encode_varint(len(ct)) + ct


def _plaintext(gossip: bytes, *, checksum: int | None = None, size: int | None = None) -> bytes:
    cksum = xxhash.xxh32_intdigest(gossip) if checksum is None else checksum
    return b"".join(
        (
            ZERO_PAD,
            cksum.to_bytes(4, "big"),
            encode_varint(len(gossip) if size is None else size),
            bytes(cramjam.snappy.compress_raw(gossip)),
        )
    )


# --- Test vectors ---------------------------------------------------------------------------


class Vector(NamedTuple):
    gossip: Gossip
    key: bytes
    raw: bytes
    checksum: int
    snappy: bytes
    plaintext: bytes
    keystream: bytes
    message: bytes


VECTORS = {
    "V1": Vector(
        V1,
        V1_KEY,
        V1_GOSSIP,
        V1_XXH32,
        V1_SNAPPY,
        V1_PLAINTEXT,
        V1_KEYSTREAM,
        V1_MESSAGE,
    ),
    "V2": Vector(
        V2,
        V2_KEY,
        V2_GOSSIP,
        V2_XXH32,
        V2_SNAPPY,
        V2_PLAINTEXT,
        V2_KEYSTREAM,
        V2_MESSAGE,
    ),
}


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_vector_layers(name: str) -> None:
    v = VECTORS[name]
    assert encode_gossip(v.gossip) == v.raw
    assert decode_gossip(v.raw) == v.gossip
    assert xxhash.xxh32_intdigest(v.raw, seed=0) == v.checksum
    assert bytes(cramjam.snappy.compress_raw(v.raw)) == v.snappy
    assert v.plaintext[32:36] == v.checksum.to_bytes(4, "big")
    assert v.plaintext[36:37] == encode_varint(len(v.raw))
    assert v.plaintext[37:] == v.snappy
    # The keystream is AES-256-ECB of the counter blocks; with zero padding ct[:32] is keystream.
    ecb = Cipher(algorithms.AES(derive_key(v.key)), modes.ECB()).encryptor()
    assert ecb.update(IV) + ecb.finalize() == v.keystream[:16]
    assert _aes_ctr(derive_key(v.key), bytes(len(v.keystream))) == v.keystream
    assert bytes(a ^ b for a, b in zip(v.plaintext, v.keystream, strict=True)) == v.message[2:]
    assert v.message[:2] == b"\xff" + encode_varint(len(v.plaintext))


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_vector_frames_both_ways(name: str) -> None:
    v = VECTORS[name]
    assert encode_frame(v.gossip, v.key, padding=ZERO_PAD) == v.message
    assert decode_frame(v.message, v.key) == v.gossip
    codec = GossipCodec(v.key)
    assert codec.send(v.gossip, ZERO_PAD) == v.message
    assert codec.receive_data(v.message) == [v.gossip]
    assert codec.buffered == 0


def test_v1_annotations() -> None:
    g = decode_frame(V1_MESSAGE, V1_KEY)
    assert g.table == (N_29999, N_30001, N_30002)
    assert g.current == BroadcastID(NetID("127.0.0.1", 29999), 1)
    assert (g.seen, g.others) == ((), ())
    assert g.distribution == (NetID("127.0.0.1", 30001), NetID("127.0.0.1", 30002))
    assert g.tag == payload_tag("hello") == 4211111929
    assert g.payload == b"world"


def test_v2_annotations_and_payload_table_reference() -> None:
    g = decode_frame(V2_MESSAGE, V2_KEY)
    assert g.table == (N_1234, N_97, N_100, N_134)
    assert g.current == BroadcastID(N_97, 4)
    assert g.seen == (BroadcastID(N_100, 3), BroadcastID(N_134, 1))
    assert g.others == (N_100,)
    assert g.distribution == (N_97, N_100, N_134)
    assert g.tag == payload_tag("broadcast_id") == 1059533093
    # The payload is a BroadcastID encoded against the shared table.
    index, off = decode_varint(g.payload, 0)
    seq, off = decode_varint(g.payload, off)
    assert (g.table[index], seq, off) == (NetID("1.2.3.4", 1), 111, 2)


def test_v2_built_with_ref() -> None:
    """The two-step way to write a payload that refers to the table, as a sender does."""
    draft = Gossip(
        BroadcastID(N_97, 4),
        (BroadcastID(N_100, 3), BroadcastID(N_134, 1)),
        (N_100,),
        (N_97, N_100, N_134),
        payload_tag("broadcast_id"),
        b"",
        (N_1234,),
    )
    payload = encode_varint(draft.ref(N_1234)) + encode_varint(111)
    g = Gossip(
        draft.current,
        draft.seen,
        draft.others,
        draft.distribution,
        draft.tag,
        payload,
        draft.table,
    )
    assert encode_frame(g, V2_KEY, padding=ZERO_PAD) == V2_MESSAGE
    with pytest.raises(ValueError):
        draft.ref(NetID("8.8.8.8", 53))


def test_seed_layout_is_rejected() -> None:
    with pytest.raises(MalformedMessage):
        decode_frame(V1_DOC_MESSAGE, V1_KEY)
    with pytest.raises(ProtocolError):
        GossipCodec(V1_KEY).receive_data(V1_DOC_MESSAGE)


def test_payload_tags() -> None:
    assert payload_tag("hello") == 4211111929
    assert payload_tag("broadcast_id") == 1059533093
    assert encode_varint(payload_tag("hello")) == bytes.fromhex("f9ef81d80f")
    assert encode_varint(payload_tag("broadcast_id")) == bytes.fromhex("a5e29cf903")


# --- VarInt ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (2**32 - 1, "ffffffff0f"),
        (2**63, "80808080808080808001"),
        (2**64 - 1, "ffffffffffffffffff01"),
    ],
)
def test_varint_edges(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert decode_varint(raw, 0) == (value, len(raw))
    assert decode_varint(b"\xaa" + raw + b"\xbb", 1) == (value, len(raw) + 1)
    assert decode_varint(memoryview(raw)) == (value, len(raw))


@pytest.mark.parametrize("raw", ["", "80", "ff", "ffff", "808080808080808080"])
def test_varint_truncated(raw: str) -> None:
    with pytest.raises(MalformedMessage):
        decode_varint(bytes.fromhex(raw), 0)


def test_varint_offset_past_end() -> None:
    with pytest.raises(MalformedMessage):
        decode_varint(b"\x01", 1)


@pytest.mark.parametrize(
    "raw",
    [
        "8080808080808080808000",  # 11 bytes, even though the value is 0
        "ffffffffffffffffffff01",  # 11 bytes
        "ffffffffffffffffff02",  # 10 bytes, value 2**64
        "ffffffffffffffffff7f",  # 10 bytes, value far above 2**64
    ],
)
def test_varint_over_long(raw: str) -> None:
    with pytest.raises(MalformedMessage):
        decode_varint(bytes.fromhex(raw), 0)


def test_varint_redundant_zero_groups_accepted() -> None:
    assert decode_varint(b"\x80\x00", 0) == (0, 2)
    assert decode_varint(b"\x81\x80\x00", 0) == (1, 3)


@pytest.mark.parametrize("value", [-1, 2**64, 2**70])
def test_varint_encode_out_of_range(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)


# --- Key rule -------------------------------------------------------------------------------


def test_key_rule() -> None:
    assert derive_key(b"secret") == b"secret01234567890123456789012345"
    assert derive_key(b"") == b"01234567890123456789012345678901"
    exact = bytes(range(32))
    assert derive_key(exact) == exact
    long = bytes(range(40))
    assert derive_key(long) == bytes(range(32))
    assert derive_key(b"A" * 31) == b"A" * 31 + b"0"
    assert derive_key(bytearray(b"secret")) == derive_key(b"secret")
    with pytest.raises(TypeError):
        derive_key("secret")  # type: ignore[arg-type]


def test_long_key_is_chopped_on_the_wire() -> None:
    assert decode_frame(V1_MESSAGE, V1_KEY + b"anything beyond 32 bytes") == V1
    assert decode_frame(V2_MESSAGE, derive_key(V2_KEY)) == V2


# --- NetID, BroadcastID, Gossip ------------------------------------------------------------


def test_netid_packing_and_text() -> None:
    n = NetID("192.168.1.97", 29999)
    assert n.packed == bytes.fromhex("c0a80161752f")
    assert NetID.from_packed(n.packed) == n
    assert str(n) == "192.168.1.97:29999"
    assert hash(NetID.from_packed(n.packed)) == hash(n)


def test_netid_ordering_is_numeric() -> None:
    a = NetID("9.255.255.255", 65535)
    b = NetID("10.0.0.1", 0)
    c = NetID("10.0.0.1", 1)
    d = NetID("10.0.0.2", 0)
    assert a < b < c < d
    assert d > c >= c > b > a
    assert a <= a
    assert sorted([d, c, b, a]) == [a, b, c, d]
    # String order would put "10." before "9." and "1.2.3.4" after "1.2.3.10".
    assert NetID("1.2.3.4", 1) < NetID("1.2.3.10", 1)
    with pytest.raises(TypeError):
        _ = a < "10.0.0.1"  # type: ignore[operator]


@pytest.mark.parametrize("host", ["256.0.0.1", "1.2.3", "::1", "localhost", "", "01.2.3.4"])
def test_netid_rejects_bad_host(host: str) -> None:
    with pytest.raises(ValueError):
        NetID(host, 1)


def test_netid_rejects_bad_port_and_types() -> None:
    for port in (-1, 65536):
        with pytest.raises(ValueError):
            NetID("1.2.3.4", port)
    with pytest.raises(TypeError):
        NetID(16909060, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        NetID.from_packed(b"\x01\x02\x03\x04\x00")


def test_message_validation() -> None:
    origin = BroadcastID(N_29999, 0)
    with pytest.raises(ValueError):
        BroadcastID(N_29999, -1)
    with pytest.raises(ValueError):
        BroadcastID(N_29999, 2**64)
    with pytest.raises(TypeError):
        BroadcastID("127.0.0.1", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Gossip(origin, tag=2**32)
    with pytest.raises(TypeError):
        Gossip(origin, others=("127.0.0.1",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Gossip(origin, payload="text")  # type: ignore[arg-type]
    g = Gossip(origin, seen=[origin], distribution=[N_30001], payload=bytearray(b"x"))  # type: ignore[arg-type]
    assert g.seen == (origin,)
    assert g.distribution == (N_30001,)
    assert g.payload == b"x"
    assert isinstance(g.payload, bytes)


def test_table_is_deduplicated_and_sorted() -> None:
    g = Gossip(
        BroadcastID(N_30002, 7),
        seen=(BroadcastID(N_30002, 1), BroadcastID(N_29999, 2)),
        others=(N_30001, N_30002),
        distribution=(N_30001, N_29999, N_30001),
        table=(N_30001, N_1234),
    )
    assert g.table == (N_1234, N_29999, N_30001, N_30002)
    raw = encode_gossip(g)
    assert raw[0] == 4
    assert raw[1:25] == b"".join(n.packed for n in g.table)
    assert decode_gossip(raw) == g


def test_minimal_gossip() -> None:
    g = Gossip(BroadcastID(N_29999, 0))
    raw = encode_gossip(g)
    assert raw == b"\x01" + N_29999.packed + b"\x00\x00\x00\x00\x00\x00"
    assert decode_gossip(raw) == g
    assert decode_frame(encode_frame(g, b"k"), b"k") == g


# --- Malformed gossip -----------------------------------------------------------------------


def _gossip_bytes(*parts: bytes | int) -> bytes:
    return b"".join(encode_varint(p) if isinstance(p, int) else p for p in parts)


@pytest.mark.parametrize(
    "raw",
    [
        # current BroadcastID refers to index 1 of a one-entry table
        _gossip_bytes(1, N_29999.packed, 1, 0, 0, 0, 0, 0),
        # seen BroadcastID index out of range
        _gossip_bytes(1, N_29999.packed, 0, 0, 1, 5, 0, 0, 0, 0),
        # other NetID index out of range
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 1, 1, 0, 0),
        # distribution NetID index out of range, huge index
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 0, 1, 2**63, 0),
        # empty table: nothing can be referenced
        _gossip_bytes(0, 0, 0, 0, 0, 0, 0),
    ],
)
def test_index_out_of_range(raw: bytes) -> None:
    with pytest.raises(MalformedMessage, match="out of range"):
        decode_gossip(raw)


@pytest.mark.parametrize(
    "raw",
    [
        _gossip_bytes(2**40, N_29999.packed),  # table count cannot fit
        _gossip_bytes(1, N_29999.packed, 0, 0, 2**62),  # seen count cannot fit
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 50, 0),  # others count cannot fit
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 0, 9, 0, 0),  # distribution count
    ],
)
def test_counts_that_cannot_fit(raw: bytes) -> None:
    with pytest.raises(MalformedMessage, match="does not fit"):
        decode_gossip(raw)


def test_unsorted_or_duplicate_table_rejected() -> None:
    for first, second in ((N_30001, N_29999), (N_29999, N_29999)):
        raw = _gossip_bytes(2, first.packed, second.packed, 0, 0, 0, 0, 0, 0)
        with pytest.raises(MalformedMessage, match="sorted"):
            decode_gossip(raw)


def test_tag_must_be_32_bit() -> None:
    raw = _gossip_bytes(1, N_29999.packed, 0, 0, 0, 0, 0, 2**32)
    with pytest.raises(MalformedMessage, match="tag"):
        decode_gossip(raw)


@pytest.mark.parametrize("raw", [V1_GOSSIP, V2_GOSSIP])
def test_truncated_gossip(raw: bytes) -> None:
    g = decode_gossip(raw)
    header_len = len(raw) - len(g.payload)
    for cut in range(header_len):
        with pytest.raises(MalformedMessage):
            decode_gossip(raw[:cut])
    # Any cut inside the payload is just a shorter payload: the payload is "the rest".
    assert decode_gossip(raw[: header_len + 1]).payload == g.payload[:1]


# --- Malformed frames -----------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"", b"wrong", V2_KEY, V1_KEY[::-1], bytes(32), b"\xff" * 64])
def test_wrong_key_raises_protocol_error(key: bytes) -> None:
    for message in (V1_MESSAGE, V2_MESSAGE):
        if derive_key(key) in (derive_key(V1_KEY), derive_key(V2_KEY)):
            continue
        with pytest.raises(ProtocolError):
            decode_frame(message, key)
        with pytest.raises(ProtocolError):
            GossipCodec(key).receive_data(message)


def test_wrong_key_v2_under_v1_key() -> None:
    with pytest.raises(ProtocolError):
        decode_frame(V2_MESSAGE, V1_KEY)


def test_frame_framing_errors() -> None:
    with pytest.raises(MalformedMessage):
        decode_frame(b"", V1_KEY)
    with pytest.raises(MalformedMessage, match="0xff"):
        decode_frame(b"\xfe" + V1_MESSAGE[1:], V1_KEY)
    with pytest.raises(MalformedMessage):
        decode_frame(V1_MESSAGE + b"\x00", V1_KEY)  # trailing byte
    with pytest.raises(MalformedMessage):
        decode_frame(V1_MESSAGE[:-1], V1_KEY)  # truncated body
    with pytest.raises(MalformedMessage):
        decode_frame(b"\xff", V1_KEY)  # truncated header
    with pytest.raises(MalformedMessage):
        decode_frame(b"\xff\x80", V1_KEY)
    with pytest.raises(MalformedMessage, match="too short"):
        decode_frame(b"\xff\x05" + bytes(5), V1_KEY)


def test_checksum_mismatch() -> None:
    frame = _frame(_plaintext(V1_GOSSIP, checksum=V1_XXH32 ^ 1), V1_KEY)
    with pytest.raises(MalformedMessage, match="checksum"):
        decode_frame(frame, V1_KEY)
    assert decode_frame(_frame(_plaintext(V1_GOSSIP), V1_KEY), V1_KEY) == V1


def test_size_field_must_match_gossip_length() -> None:
    """Stricter than the reference, which ignores the size field."""
    for size in (len(V1_GOSSIP) - 1, len(V1_GOSSIP) + 1, 0):
        with pytest.raises(MalformedMessage, match="disagrees"):
            decode_frame(_frame(_plaintext(V1_GOSSIP, size=size), V1_KEY), V1_KEY)


def test_bad_snappy_block() -> None:
    pt = ZERO_PAD + V1_XXH32.to_bytes(4, "big") + b"\x24" + b"\x24" + b"\xff" * 10
    with pytest.raises(MalformedMessage, match="snappy"):
        decode_frame(_frame(pt, V1_KEY), V1_KEY)
    # Trailing bytes after a complete snappy block are an error too.
    with pytest.raises(MalformedMessage):
        decode_frame(_frame(_plaintext(V1_GOSSIP) + b"\x00", V1_KEY), V1_KEY)


def test_plaintext_too_short_for_size() -> None:
    with pytest.raises(MalformedMessage):
        decode_frame(_frame(ZERO_PAD + bytes(4) + b"\x80\x80", V1_KEY), V1_KEY)


# --- Limits ---------------------------------------------------------------------------------


def test_header_above_max_size_rejected_before_body() -> None:
    codec = GossipCodec(V1_KEY, max_size=1000)
    codec.receive_data(b"\xff")
    with pytest.raises(MessageTooLarge):
        codec.receive_data(encode_varint(1001))
    assert codec.buffered <= 11
    with pytest.raises(MessageTooLarge):
        decode_frame(b"\xff" + encode_varint(1001), V1_KEY, max_size=1000)
    # Exactly max_size is allowed through the header.
    codec = GossipCodec(V1_KEY, max_size=1000)
    assert codec.receive_data(b"\xff" + encode_varint(1000) + bytes(10)) == []
    assert codec.buffered == 10


def test_default_max_size_header() -> None:
    codec = GossipCodec(V1_KEY)
    assert codec.max_size == DEFAULT_MAX_SIZE
    with pytest.raises(MessageTooLarge):
        codec.receive_data(b"\xff" + encode_varint(DEFAULT_MAX_SIZE + 1))


def test_decompression_bomb_rejected() -> None:
    """A tiny frame announcing a huge gossip is refused before snappy allocates anything."""
    huge = 2**32 - 1
    for size_field, snappy_len in ((huge, huge), (10, huge), (huge, 10)):
        pt = ZERO_PAD + bytes(4) + encode_varint(size_field) + encode_varint(snappy_len) + b"\0"
        with pytest.raises(ProtocolError):
            decode_frame(_frame(pt, V1_KEY), V1_KEY, max_size=1 << 20)
    pt = ZERO_PAD + bytes(4) + encode_varint(huge) + encode_varint(huge) + b"\0"
    with pytest.raises(MessageTooLarge):
        decode_frame(_frame(pt, V1_KEY), V1_KEY, max_size=1 << 20)
    # A real, very compressible gossip: the frame is small, the gossip is not.
    g = Gossip(BroadcastID(N_29999, 1), payload=bytes(1 << 20))
    frame = encode_frame(g, V1_KEY)
    assert len(frame) < 64 * 1024
    with pytest.raises(MessageTooLarge):
        decode_frame(frame, V1_KEY, max_size=64 * 1024)
    with pytest.raises(MessageTooLarge):
        GossipCodec(V1_KEY, max_size=64 * 1024).receive_data(frame)
    assert decode_frame(frame, V1_KEY, max_size=(1 << 20) + 100) == g


def test_send_refuses_what_a_peer_would_reject() -> None:
    codec = GossipCodec(V1_KEY, max_size=100)
    with pytest.raises(LocalProtocolError):
        codec.send(Gossip(BroadcastID(N_29999, 1), payload=bytes(200)))
    with pytest.raises(LocalProtocolError):
        codec.send(V1, bytes(31))
    with pytest.raises(LocalProtocolError):
        encode_frame(V1, V1_KEY, padding=bytes(33))


# --- Stream codec ---------------------------------------------------------------------------


def test_stream_one_byte_at_a_time() -> None:
    codec = GossipCodec(V2_KEY)
    stream = V2_MESSAGE * 3
    got: list[Gossip] = []
    for i in range(len(stream)):
        got += codec.receive_data(stream[i : i + 1])
    assert got == [V2, V2, V2]
    assert codec.buffered == 0
    codec.receive_eof()


def test_stream_many_frames_at_once_and_random_padding() -> None:
    codec = GossipCodec(V1_KEY)
    frames = [codec.send(V1) for _ in range(5)]
    assert len(set(frames)) == 5  # fresh random padding each time
    assert {f[34:] for f in frames} == {V1_MESSAGE[34:]}  # CTR: only the pad bytes differ
    assert codec.receive_data(bytearray(b"".join(frames))) == [V1] * 5
    assert codec.receive_data(memoryview(b"".join(frames))) == [V1] * 5
    assert codec.receive_data(b"") == []


def test_stream_bad_start_byte_kills_codec() -> None:
    codec = GossipCodec(V1_KEY)
    with pytest.raises(MalformedMessage):
        codec.receive_data(V1_MESSAGE + b"\x00")
    with pytest.raises(MalformedMessage):
        codec.receive_data(V1_MESSAGE)
    with pytest.raises(MalformedMessage):
        codec.receive_eof()


def test_stream_dead_after_too_large() -> None:
    codec = GossipCodec(V1_KEY, max_size=50)
    with pytest.raises(MessageTooLarge):
        codec.receive_data(b"\xff\x7f")
    with pytest.raises(MessageTooLarge):
        codec.receive_data(b"")


def test_stream_header_errors() -> None:
    with pytest.raises(MalformedMessage, match="over-long"):
        GossipCodec(V1_KEY).receive_data(b"\xff" + b"\x80" * 10)
    with pytest.raises(MalformedMessage, match="too short"):
        GossipCodec(V1_KEY).receive_data(b"\xff\x00")
    with pytest.raises(MalformedMessage):
        GossipCodec(V1_KEY).receive_data(b"\xff" + bytes.fromhex("ffffffffffffffffff02"))


def test_stream_eof_inside_message() -> None:
    codec = GossipCodec(V1_KEY)
    assert codec.receive_data(V1_MESSAGE[:10]) == []
    with pytest.raises(MalformedMessage, match="ended"):
        codec.receive_eof()
    codec = GossipCodec(V1_KEY)
    codec.receive_data(b"\xff")
    with pytest.raises(MalformedMessage):
        codec.receive_eof()


def test_codec_rejects_negative_max_size() -> None:
    with pytest.raises(ValueError):
        GossipCodec(V1_KEY, max_size=-1)

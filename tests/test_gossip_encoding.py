"""Gossip codec below the cipher: VarInts, the key rule, the NetID, BroadcastID and Gossip
values, and the gossip body's encoding with every way a body can be malformed."""

from __future__ import annotations

import pytest

from tests.gossip_helpers import (
    N_1234,
    N_29999,
    N_30001,
    N_30002,
    V1,
    V1_GOSSIP,
    V1_KEY,
    V1_MESSAGE,
    V2,
    V2_GOSSIP,
    V2_KEY,
    V2_MESSAGE,
)
from wire.errors import LocalProtocolError, MalformedMessage
from wire.gossip import (
    BroadcastID,
    Gossip,
    NetID,
    decode_frame,
    decode_gossip,
    decode_varint,
    derive_key,
    encode_frame,
    encode_gossip,
    encode_varint,
)

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
        _ = a < "10.0.0.1"


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
        distribution=(N_30001, N_29999),
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


@pytest.mark.parametrize(
    "raw",
    [
        # others names table entry 1 twice
        _gossip_bytes(2, N_29999.packed, N_30001.packed, 0, 0, 0, 2, 1, 1, 0, 0),
        # distribution names entry 0 twice, after a distinct one
        _gossip_bytes(2, N_29999.packed, N_30001.packed, 0, 0, 0, 0, 3, 0, 1, 0, 0),
        # longer than the table: refused from its count, before one reference is read
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0),
        _gossip_bytes(1, N_29999.packed, 0, 0, 0, 2, 0, 0, 0, 0),
    ],
    ids=["others-repeat", "distribution-repeat", "distribution-too-long", "others-too-long"],
)
def test_repeated_references_rejected(raw: bytes) -> None:
    with pytest.raises(MalformedMessage, match="repeats a NetID"):
        decode_gossip(raw)


def test_a_million_references_are_refused_from_the_count() -> None:
    """Snappy shrinks a list of one repeated index to almost nothing: the count alone decides."""
    raw = _gossip_bytes(1, N_29999.packed, 0, 0, 0, 0, 1_000_000, bytes(1_000_000), 0)
    with pytest.raises(MalformedMessage, match="repeats a NetID"):
        decode_gossip(raw)


def test_netid_table_and_seen_bounded_by_max_netids() -> None:
    table = (N_1234, N_29999, N_30001)
    raw = _gossip_bytes(3, *(n.packed for n in table), 0, 0, 0, 0, 0, 0)
    assert decode_gossip(raw, max_netids=3).table == table
    with pytest.raises(MalformedMessage, match="max_netids"):
        decode_gossip(raw, max_netids=2)
    # seen may name one origin more than once, but holds at most max_netids BroadcastIDs
    seen = _gossip_bytes(1, N_29999.packed, 0, 0, 3, 0, 1, 0, 2, 0, 3, 0, 0, 0)
    assert len(decode_gossip(seen, max_netids=3).seen) == 3
    with pytest.raises(MalformedMessage, match="max_netids"):
        decode_gossip(seen, max_netids=2)


def test_gossip_refuses_repeated_references() -> None:
    origin = BroadcastID(N_29999, 0)
    with pytest.raises(ValueError, match="repeats"):
        Gossip(origin, others=(N_30001, N_30001))
    with pytest.raises(ValueError, match="repeats"):
        Gossip(origin, distribution=(N_30001, N_30002, N_30001))
    # the same NetID in different fields is fine (the table holds it once)
    g = Gossip(origin, others=(N_29999,), distribution=(N_29999, N_30001))
    assert decode_gossip(encode_gossip(g)) == g


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

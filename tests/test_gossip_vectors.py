"""Gossip frame codec: the reference test vectors byte for byte, layer by layer (gossip,
xxh32, snappy, plaintext, AES-CTR keystream, frame), both ways, and what they carry."""

from __future__ import annotations

from typing import NamedTuple

import cramjam
import pytest
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.gossip_helpers import (
    IV,
    N_97,
    N_100,
    N_134,
    N_1234,
    N_29999,
    N_30001,
    N_30002,
    V1,
    V1_DOC_MESSAGE,
    V1_GOSSIP,
    V1_KEY,
    V1_KEYSTREAM,
    V1_MESSAGE,
    V1_PLAINTEXT,
    V1_SNAPPY,
    V1_XXH32,
    V2,
    V2_GOSSIP,
    V2_KEY,
    V2_KEYSTREAM,
    V2_MESSAGE,
    V2_PLAINTEXT,
    V2_SNAPPY,
    V2_XXH32,
    ZERO_PAD,
    aes_ctr,
)
from wire.errors import MalformedMessage, ProtocolError
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
    assert aes_ctr(derive_key(v.key), bytes(len(v.keystream))) == v.keystream
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

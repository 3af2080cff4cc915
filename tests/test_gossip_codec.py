"""Gossip frame codec, every rejection path of a frame: wrong keys, framing, checksum, size
and snappy errors, the size limits (decompression bombs included), and the stream codec
fed in pieces."""

from __future__ import annotations

import pytest

from tests.gossip_helpers import (
    N_29999,
    V1,
    V1_GOSSIP,
    V1_KEY,
    V1_MESSAGE,
    V1_XXH32,
    V2,
    V2_KEY,
    V2_MESSAGE,
    ZERO_PAD,
    frame_around,
    plaintext_of,
)
from wire import DEFAULT_MAX_SIZE
from wire.errors import LocalProtocolError, MalformedMessage, MessageTooLarge, ProtocolError
from wire.gossip import (
    BroadcastID,
    Gossip,
    GossipCodec,
    decode_frame,
    derive_key,
    encode_frame,
    encode_varint,
)

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
    frame = frame_around(plaintext_of(V1_GOSSIP, checksum=V1_XXH32 ^ 1), V1_KEY)
    with pytest.raises(MalformedMessage, match="checksum"):
        decode_frame(frame, V1_KEY)
    assert decode_frame(frame_around(plaintext_of(V1_GOSSIP), V1_KEY), V1_KEY) == V1


def test_size_field_must_match_gossip_length() -> None:
    """Stricter than the reference, which ignores the size field."""
    for size in (len(V1_GOSSIP) - 1, len(V1_GOSSIP) + 1, 0):
        with pytest.raises(MalformedMessage, match="disagrees"):
            decode_frame(frame_around(plaintext_of(V1_GOSSIP, size=size), V1_KEY), V1_KEY)


def test_bad_snappy_block() -> None:
    pt = ZERO_PAD + V1_XXH32.to_bytes(4, "big") + b"\x24" + b"\x24" + b"\xff" * 10
    with pytest.raises(MalformedMessage, match="snappy"):
        decode_frame(frame_around(pt, V1_KEY), V1_KEY)
    # Trailing bytes after a complete snappy block are an error too.
    with pytest.raises(MalformedMessage):
        decode_frame(frame_around(plaintext_of(V1_GOSSIP) + b"\x00", V1_KEY), V1_KEY)


def test_plaintext_too_short_for_size() -> None:
    with pytest.raises(MalformedMessage):
        decode_frame(frame_around(ZERO_PAD + bytes(4) + b"\x80\x80", V1_KEY), V1_KEY)


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
            decode_frame(frame_around(pt, V1_KEY), V1_KEY, max_size=1 << 20)
    pt = ZERO_PAD + bytes(4) + encode_varint(huge) + encode_varint(huge) + b"\0"
    with pytest.raises(MessageTooLarge):
        decode_frame(frame_around(pt, V1_KEY), V1_KEY, max_size=1 << 20)
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
    with pytest.raises(LocalProtocolError, match="max_netids"):
        GossipCodec(V1_KEY, max_netids=2).send(V1)  # a table of 3


def test_max_netids_applies_to_frames_and_streams() -> None:
    assert len(V2.table) == 4
    assert decode_frame(V2_MESSAGE, V2_KEY, max_netids=4) == V2
    assert GossipCodec(V2_KEY, max_netids=4).receive_data(V2_MESSAGE) == [V2]
    with pytest.raises(MalformedMessage, match="max_netids"):
        decode_frame(V2_MESSAGE, V2_KEY, max_netids=3)
    codec = GossipCodec(V2_KEY, max_netids=3)
    with pytest.raises(MalformedMessage, match="max_netids"):
        codec.receive_data(V2_MESSAGE)
    with pytest.raises(ProtocolError):  # the stream stays failed
        codec.receive_data(V1_MESSAGE)


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

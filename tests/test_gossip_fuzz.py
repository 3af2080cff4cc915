"""Property tests: round trips, arbitrary stream chunking, hostile bytes only ever raising
ProtocolError while the stream reader stays within its memory bound, and which reference
lists the decoder accepts."""

from __future__ import annotations

import contextlib
import ipaddress

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire.errors import ProtocolError
from wire.gossip import (
    BroadcastID,
    Gossip,
    GossipCodec,
    NetID,
    decode_frame,
    decode_gossip,
    encode_frame,
    encode_gossip,
    encode_varint,
)

KEY = b"fuzz key"
HEADER_MAX = 11  # start byte + a 10-byte VarInt
SMALL_MAX = 200

FAST = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

hosts = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
# Few distinct addresses too, so references repeat and the table de-duplicates.
netids = st.one_of(
    st.builds(NetID, hosts, st.integers(0, 65535)),
    st.builds(NetID, st.sampled_from(["10.0.0.1", "10.0.0.2", "9.0.0.1"]), st.integers(0, 3)),
)
broadcast_ids = st.builds(BroadcastID, netids, st.integers(0, 2**64 - 1))
gossips = st.builds(
    Gossip,
    current=broadcast_ids,
    seen=st.lists(broadcast_ids, max_size=20).map(tuple),
    # within a list a NetID appears once (decoders refuse repeats); across lists it may recur
    others=st.lists(netids, max_size=20, unique=True).map(tuple),
    distribution=st.lists(netids, max_size=20, unique=True).map(tuple),
    tag=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=300),
    table=st.lists(netids, max_size=5).map(tuple),
)
paddings = st.binary(min_size=32, max_size=32)


@FAST
@given(gossips, paddings)
def test_round_trip(g: Gossip, padding: bytes) -> None:
    raw = encode_gossip(g)
    assert decode_gossip(raw) == g
    frame = encode_frame(g, KEY, padding=padding)
    assert decode_frame(frame, KEY) == g
    codec = GossipCodec(KEY)
    assert codec.receive_data(codec.send(g, padding)) == [g]


@FAST
@given(st.lists(gossips, min_size=1, max_size=6), st.data())
def test_any_chunking_gives_the_same_messages(msgs: list[Gossip], data: st.DataObject) -> None:
    sender = GossipCodec(KEY)
    stream = b"".join(sender.send(g) for g in msgs)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=40)))
    receiver = GossipCodec(KEY)
    got: list[Gossip] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        got += receiver.receive_data(stream[start:cut])
        start = cut
    assert got == msgs
    assert receiver.buffered == 0
    receiver.receive_eof()


def _feed(chunks: list[bytes], max_size: int) -> None:
    """Feed a stream and a datagram decoder; only ProtocolError may come out."""
    codec = GossipCodec(KEY, max_size=max_size)
    try:
        for chunk in chunks:
            codec.receive_data(chunk)
            assert codec.buffered <= HEADER_MAX + max_size
    except ProtocolError:
        assert codec.buffered <= HEADER_MAX + max_size
        with pytest.raises(ProtocolError):  # a failed codec stays failed
            codec.receive_data(b"\xff")
    with contextlib.suppress(ProtocolError):
        decode_frame(b"".join(chunks), KEY, max_size=max_size)


@FAST
@given(st.lists(st.binary(max_size=80), max_size=8))
def test_random_bytes(chunks: list[bytes]) -> None:
    _feed(chunks, SMALL_MAX)
    _feed([b"\xff" + c for c in chunks], SMALL_MAX)
    with contextlib.suppress(ProtocolError):
        decode_gossip(b"".join(chunks))


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid frame under the small limit, then byte flips, inserts, deletes or a cut."""
    g = draw(gossips.filter(lambda g: len(encode_gossip(g)) < 120))
    frame = bytearray(encode_frame(g, KEY, padding=draw(paddings)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and frame:
            frame[i] = draw(st.integers(0, 255))
        elif op == "insert":
            frame[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and frame:
            del frame[i : i + draw(st.integers(1, 4))]
        elif op == "truncate":
            del frame[i:]
    return bytes(frame)


@FAST
@given(mutated_frames(), st.data())
def test_mutated_frames(frame: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(frame)), max_size=6)))
    chunks = [frame[a:b] for a, b in zip([0, *cuts], [*cuts, len(frame)], strict=True)]
    _feed(chunks, SMALL_MAX)
    _feed(chunks + chunks, SMALL_MAX)


@FAST
@given(gossips, st.integers(0, 2**64 - 1))
def test_mutated_gossip_bodies(g: Gossip, seed: int) -> None:
    raw = bytearray(encode_gossip(g))
    raw[seed % len(raw)] ^= 1 + (seed >> 8) % 255
    with contextlib.suppress(ProtocolError):
        decode_gossip(bytes(raw))
    with contextlib.suppress(ProtocolError):
        decode_gossip(bytes(raw[: seed % len(raw)]))


@FAST
@given(
    st.integers(1, 6),
    st.lists(st.integers(0, 7), max_size=9),
    st.lists(st.integers(0, 7), max_size=9),
    st.integers(1, 8),
)
def test_reference_lists_accepted_exactly_without_repeats(
    size: int, others: list[int], distribution: list[int], max_netids: int
) -> None:
    """Any body: decoded iff its table fits max_netids and each reference list is in range
    and free of repeats (so never longer than the table)."""
    table = b"".join(NetID("10.0.0.1", port).packed for port in range(size))
    lists = [encode_varint(len(refs)) + bytes(refs) for refs in (others, distribution)]
    raw = encode_varint(size) + table + b"\x00\x00\x00" + b"".join(lists) + b"\x00"
    valid = size <= max_netids and all(
        len(set(refs)) == len(refs) and all(i < size for i in refs)
        for refs in (others, distribution)
    )
    try:
        g = decode_gossip(raw, max_netids=max_netids)
    except ProtocolError:
        assert not valid
    else:
        assert valid
        assert [g.table.index(n) for n in g.others] == others
        assert [g.table.index(n) for n in g.distribution] == distribution


@FAST
@given(st.integers(SMALL_MAX + 1, 2**64 - 1))
def test_oversized_header_never_buffers_the_body(length: int) -> None:
    codec = GossipCodec(KEY, max_size=SMALL_MAX)
    try:
        codec.receive_data(b"\xff" + encode_varint(length) + bytes(SMALL_MAX * 2))
    except ProtocolError:
        assert codec.buffered <= HEADER_MAX
    else:
        raise AssertionError("oversized header accepted")

"""Property tests of the Gotalk codec: round trips, arbitrary re-chunking, and hostile bytes
only ever raising ProtocolError while the buffer stays within header + max_size."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.codec_helpers import fed_by_missing
from wire.errors import LocalProtocolError, MalformedMessage, ProtocolError
from wire.gotalk import (
    MAX_NAME_SIZE,
    VERSION,
    ErrorResult,
    Fault,
    GotalkConnection,
    Heartbeat,
    Message,
    MessageType,
    Notification,
    Request,
    Result,
    RetryResult,
    StreamRequest,
    StreamRequestPart,
    StreamResult,
    encode,
    encode_parts,
    id_format,
    id_header,
    request_format,
    request_header,
)
from wire.gotalk.encoding import REQUEST_FORMATS

SMALL_MAX = 64
LONGEST_HEADER = 1 + 4 + 3 + MAX_NAME_SIZE + 8  # r/s with a 4095-byte name
BUFFER_BOUND = LONGEST_HEADER + SMALL_MAX

FAST = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.binary(min_size=4, max_size=4)
payloads = st.binary(max_size=300)
small_payloads = st.binary(max_size=SMALL_MAX)
names = st.text(max_size=40) | st.text(alphabet="\u00e9\u263a\U0001f600x", max_size=1300)
u32 = st.integers(0, 2**32 - 1)


def messages_of(payload: st.SearchStrategy[bytes]) -> st.SearchStrategy[Message]:
    return st.one_of(
        st.builds(Request, ids, names, payload),
        st.builds(StreamRequest, ids, names, payload),
        st.builds(StreamRequestPart, ids, payload),
        st.builds(Result, ids, payload),
        st.builds(StreamResult, ids, payload),
        st.builds(ErrorResult, ids, payload),
        st.builds(RetryResult, ids, u32, payload),
        st.builds(Notification, names, payload),
        st.builds(Heartbeat, st.integers(0, 0xFFFF), u32),
        st.builds(Fault, u32),
    )


def sendable(message: Message) -> bool:
    name = getattr(message, "op", None) or getattr(message, "name", "")
    return len(name.encode()) <= MAX_NAME_SIZE


messages = messages_of(payloads).filter(sendable)


def feed(conn: GotalkConnection, chunks: Sequence[bytes | memoryview]) -> list[Message]:
    out: list[Message] = []
    for chunk in chunks:
        out += conn.receive_data(chunk)
    return out


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@FAST
@given(messages)
def test_round_trip(message: Message) -> None:
    wire = encode(message)
    header, payload = encode_parts(message)
    assert header + payload == wire
    conn = GotalkConnection()
    assert conn.receive_data(VERSION + wire) == [message]
    assert conn.buffered == 0
    # And fed as the two WebSocket frames.
    conn = GotalkConnection()
    assert feed(conn, [VERSION, header, payload]) == [message]


@FAST
@given(st.lists(messages, max_size=30), st.lists(st.integers(0, 100_000), max_size=40))
def test_any_chunking_gives_the_same_messages(batch: list[Message], cuts: list[int]) -> None:
    stream = VERSION + b"".join(encode(m) for m in batch)
    assert feed(GotalkConnection(), split(stream, cuts)) == batch


@FAST
@given(st.lists(messages, max_size=30), st.lists(st.integers(0, 100_000), max_size=40))
def test_any_chunking_of_views_gives_the_same_messages(
    batch: list[Message], cuts: list[int]
) -> None:
    """Memoryviews, as rpc.peer.Peer._read gives the slices of a large read: the part a
    message in progress takes is copied once, the rest parsed as bytes."""
    stream = VERSION + b"".join(encode(m) for m in batch)
    views = [memoryview(chunk) for chunk in split(stream, cuts)]
    assert feed(GotalkConnection(), views) == batch


@settings(FAST, max_examples=40)
@given(st.lists(messages_of(st.binary(max_size=20)).filter(sendable), max_size=8))
def test_one_byte_at_a_time(batch: list[Message]) -> None:
    stream = VERSION + b"".join(encode(m) for m in batch)
    conn = GotalkConnection()
    assert feed(conn, [stream[i : i + 1] for i in range(len(stream))]) == batch
    assert conn.buffered == 0


def survive(chunks: list[bytes]) -> None:
    """Feed hostile chunks: messages or a ProtocolError, never anything else, and the
    buffer stays within one header plus SMALL_MAX."""
    conn = GotalkConnection(max_size=SMALL_MAX)
    for chunk in chunks:
        try:
            for message in conn.receive_data(chunk):
                assert len(getattr(message, "payload", b"")) <= SMALL_MAX
        except ProtocolError as exc:
            assert exc.code in (1, 2)
            assert conn.error is exc
            return
        finally:
            assert conn.buffered <= BUFFER_BOUND


# Random bytes mostly die on the version, so also try them after a valid one, and from an
# alphabet of type letters and hex digits that gets further into headers.
_HEADER_BYTES = b"rspRSEenhf0123456789abcdefABCDEFxg\x00"
HEADERISH = st.binary(max_size=400).map(
    lambda raw: bytes(_HEADER_BYTES[b % len(_HEADER_BYTES)] for b in raw)
)


@FAST
@given(st.lists(st.binary(max_size=200), max_size=6), st.booleans())
def test_random_bytes(chunks: list[bytes], versioned: bool) -> None:
    survive([VERSION, *chunks] if versioned else chunks)


@FAST
@given(st.lists(HEADERISH, min_size=1, max_size=6))
def test_random_header_like_bytes(chunks: list[bytes]) -> None:
    survive([VERSION, *chunks])


mutations = st.lists(
    st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate"]), st.integers(0, 10**6)),
    min_size=1,
    max_size=6,
)


@settings(FAST, max_examples=1000)
@given(
    st.lists(messages_of(small_payloads).filter(sendable), min_size=1, max_size=10),
    mutations,
    st.lists(st.integers(0, 10**6), max_size=10),
    st.binary(min_size=6, max_size=6),
)
def test_mutated_streams(
    batch: list[Message], edits: list[tuple[str, int]], cuts: list[int], noise: bytes
) -> None:
    stream = bytearray(VERSION + b"".join(encode(m) for m in batch))
    for i, (edit, at) in enumerate(edits):
        if not stream:
            break
        at %= len(stream)
        if edit == "flip":
            stream[at] ^= 1 << (noise[i] % 8)
        elif edit == "insert":
            stream[at:at] = noise[i : i + 1]
        elif edit == "delete":
            del stream[at]
        else:
            del stream[at:]
    survive(split(bytes(stream), cuts))


@FAST
@given(
    st.sampled_from([b"R0001", b"r0001004echo", b"e000100000000", b"n004note", b"p0001"]),
    st.integers(SMALL_MAX + 1, 2**32 - 1),
    st.lists(st.integers(0, 100), max_size=5),
)
def test_oversized_headers_fail_before_the_payload(
    start: bytes, size: int, cuts: list[int]
) -> None:
    header = start + b"%08x" % size
    conn = GotalkConnection(max_size=SMALL_MAX)
    chunks = split(VERSION + header, cuts)
    try:
        for chunk in chunks:
            assert conn.receive_data(chunk) == []
            assert conn.buffered < len(header)
    except ProtocolError as exc:
        assert exc.code == 2
        assert conn.buffered == 0
    else:
        raise AssertionError("an oversized header was accepted")


HEX = frozenset(b"0123456789abcdefABCDEF")
fields = st.binary(min_size=8, max_size=8) | st.text(
    alphabet="0123456789abcdefABCDEF +-_xX\t\n", min_size=8, max_size=8
).map(str.encode)


@FAST
@given(fields)
def test_size_fields_accept_exactly_hex_digits(field: bytes) -> None:
    """No whitespace, sign, underscore or 0x prefix sneaks through (as int(x, 16) would)."""
    conn = GotalkConnection(max_size=2**32)
    wire = b"R0001" + field
    if set(field) <= HEX:
        size = int(field, 16)
        payload = b"y" * min(size, 3)
        out = conn.receive_data(VERSION + wire + payload)
        assert out == ([Result(b"0001", payload)] if size <= 3 else [])
        assert conn.buffered == (0 if size <= 3 else len(wire) + 3)
    else:
        try:
            conn.receive_data(VERSION + wire)
        except MalformedMessage as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"accepted size field {field!r}")


@FAST
@given(st.binary(min_size=3, max_size=3))
def test_name_size_accepts_exactly_hex_digits(field: bytes) -> None:
    conn = GotalkConnection()
    wire = b"n" + field
    if set(field) <= HEX:
        assert conn.receive_data(VERSION + wire) == []
        name = b"a" * int(field, 16)
        assert conn.receive_data(name + b"00000000") == [Notification(name.decode(), b"")]
    else:
        try:
            conn.receive_data(VERSION + wire)
        except MalformedMessage as exc:
            assert exc.code == 2
        else:
            raise AssertionError(f"accepted name size {field!r}")


@FAST
@given(
    st.lists(st.tuples(ids, st.text(max_size=40) | st.text("%bx0\u00e9", max_size=8), payloads)),
    st.booleans(),
)
def test_request_header_matches_the_message_encoder(
    calls: list[tuple[bytes, str, bytes]], stream: bool
) -> None:
    """The hot-path header (its per-operation format kept for REQUEST_FORMATS operations,
    names with % included) is byte for byte what encode_parts gives, before and after the
    format cache has been filled past its size."""
    kind, cls = (
        (MessageType.STREAM_REQUEST, StreamRequest) if stream else (MessageType.REQUEST, Request)
    )
    for _ in range(2):
        for message_id, op, payload in calls:
            header = request_header(kind, message_id, op, len(payload))
            assert header == encode_parts(cls(message_id, op, payload))[0]
    for index in range(REQUEST_FORMATS + 1):  # evicts the formats above
        request_header(kind, b"abcd", f"op{index}", 0)
    for message_id, op, payload in calls:
        header = request_header(kind, message_id, op, len(payload))
        assert header == encode_parts(cls(message_id, op, payload))[0]


def test_request_header_takes_request_types_only() -> None:
    with pytest.raises(LocalProtocolError, match="not a request type"):
        request_header(MessageType.RESULT, b"abcd", "op", 1)
    with pytest.raises(LocalProtocolError, match="not a request type"):
        request_format(MessageType.RESULT, "op")


IdMessage = type[StreamRequestPart] | type[Result] | type[StreamResult] | type[ErrorResult]
ID_KINDS: tuple[tuple[MessageType, IdMessage], ...] = (
    (MessageType.STREAM_REQUEST_PART, StreamRequestPart),
    (MessageType.RESULT, Result),
    (MessageType.STREAM_RESULT, StreamResult),
    (MessageType.ERROR_RESULT, ErrorResult),
)


@FAST
@given(ids, names, payloads, st.sampled_from(ID_KINDS), st.booleans())
def test_kept_formats_are_the_checked_headers(
    message_id: bytes,
    op: str,
    payload: bytes,
    id_kind: tuple[MessageType, IdMessage],
    stream: bool,
) -> None:
    """What a caller that keeps a format writes (an id of 4 bytes, a size that fits) is
    byte for byte the checked header and the message encoder's."""
    kind, cls = id_kind
    size = len(payload)
    header = id_format(kind) % (message_id, size)
    assert header == id_header(kind, message_id, size)
    assert header == encode_parts(cls(message_id, payload))[0]
    request_kind = MessageType.STREAM_REQUEST if stream else MessageType.REQUEST
    header = request_format(request_kind, op) % (message_id, size)
    assert header == request_header(request_kind, message_id, op, size)


def test_id_format_takes_id_types_only() -> None:
    for kind in (MessageType.REQUEST, MessageType.NOTIFICATION, MessageType.HEARTBEAT):
        with pytest.raises(LocalProtocolError, match="not a p, R, S or E type"):
            id_format(kind)


@FAST
@given(st.lists(messages, min_size=1, max_size=6), st.integers(0, 400))
def test_missing_is_what_completes_the_message_held(batch: list[Message], cut: int) -> None:
    """``missing`` (what a reader slices a large read by, rpc.peer.Peer._read): the bytes
    that complete the version or message held in part, a lower bound while its header
    is incomplete, and 0 only when nothing is held."""
    stream = VERSION + b"".join(encode(m) for m in batch)
    assert fed_by_missing(GotalkConnection(), stream, cut) == batch

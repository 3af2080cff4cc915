"""Unit tests of the Gotalk codec: each message type, limits, bad sends, connection state."""

from __future__ import annotations

import gc
import pickle
import tracemalloc

import pytest

from wire import DEFAULT_MAX_SIZE
from wire.errors import (
    LocalProtocolError,
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    UnsupportedVersion,
)
from wire.gotalk import (
    MAX_NAME_SIZE,
    VERSION,
    ErrorCode,
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
)

ID = b"\x00\xff\x10a"

# (message, exact bytes): one of each type, with a binary id where there is one.
EXAMPLES: list[tuple[Message, bytes]] = [
    (Request(ID, "echo", b"hi"), b"r\x00\xff\x10a004echo00000002hi"),
    (StreamRequest(ID, "up", b"abc"), b"s\x00\xff\x10a002up00000003abc"),
    (StreamRequestPart(ID, b""), b"p\x00\xff\x10a00000000"),
    (Result(ID, b"x" * 255), b"R\x00\xff\x10a000000ff" + b"x" * 255),
    (StreamResult(ID, b"chunk"), b"S\x00\xff\x10a00000005chunk"),
    (ErrorResult(ID, b"bad"), b"E\x00\xff\x10a00000003bad"),
    (RetryResult(ID, 5000, b"later"), b"e\x00\xff\x10a0000138800000005later"),
    (Notification("chat message", b"{}"), b"n00cchat message00000002{}"),
    (Notification("", b""), b"n00000000000"),
    (Heartbeat(0xFFFF, 0xFFFFFFFF), b"hffffffffffff"),
    (Heartbeat(0, 0), b"h000000000000"),
    (Fault(ErrorCode.TIMEOUT), b"f00000003"),
    (Fault(0xDEADBEEF), b"fdeadbeef"),
]


def connected(max_size: int = DEFAULT_MAX_SIZE) -> GotalkConnection:
    conn = GotalkConnection(max_size=max_size)
    assert conn.receive_data(VERSION) == []
    return conn


@pytest.mark.parametrize(("message", "wire"), EXAMPLES, ids=lambda v: type(v).__name__)
def test_each_type_encodes_and_decodes(message: Message, wire: bytes) -> None:
    assert encode(message) == wire
    header, payload = encode_parts(message)
    assert header + payload == wire
    assert payload == getattr(message, "payload", b"")
    assert type(header) is bytes and type(payload) is bytes
    decoded = connected().receive_data(wire)
    assert decoded == [message]
    assert type(decoded[0]) is type(message)
    assert hash(decoded[0]) == hash(message)
    assert wire[:1] == message.TYPE.encode()


def test_message_types_are_the_type_bytes() -> None:
    assert [t.value for t in MessageType] == list("rspRSEenhf")
    # every type byte has its message class (each example's first byte is its TYPE: above)
    assert {type(m).TYPE for m, _ in EXAMPLES} == set(MessageType)
    assert len({type(m) for m, _ in EXAMPLES}) == len(MessageType)


def test_decoded_messages_are_frozen() -> None:
    (message,) = connected().receive_data(b"r0001004echo00000000")
    with pytest.raises(AttributeError):
        message.op = "other"  # type: ignore[misc]


def test_messages_are_untracked_by_the_garbage_collector() -> None:
    """A backlog of decoded messages must not be walked by every full collection (100
    flooding connections keep up to 1.6 million): a message of bytes, text and ints is not
    tracked, decoded or built (a Fault holding an ErrorCode member is: it is never kept)."""
    wire = b"".join(raw for _, raw in EXAMPLES)
    decoded = connected().receive_data(wire)
    assert decoded == [m for m, _ in EXAMPLES]
    for message in [*decoded, *(m for m, _ in EXAMPLES)]:
        if not (type(message) is Fault and type(message.code) is ErrorCode):
            assert not gc.is_tracked(message), message


def test_messages_pickle_and_match_by_field() -> None:
    for message, _ in EXAMPLES:
        assert pickle.loads(pickle.dumps(message)) == message
    match connected().receive_data(b"r0001004echo00000002hi"):
        case [Request(id, op, payload)]:
            assert (id, op, payload) == (b"0001", "echo", b"hi")
        case other:
            pytest.fail(f"no match: {other!r}")


def test_fault_codes_decode_to_error_code_when_known() -> None:
    conn = connected()
    known, unknown = conn.receive_data(b"f00000001f0000002a")
    assert known == Fault(ErrorCode.UNSUPPORTED_PROTOCOL)
    assert type(known.code) is ErrorCode
    assert unknown == Fault(42) and type(unknown.code) is int


def test_error_code_values() -> None:
    assert [int(c) for c in ErrorCode] == [0, 1, 2, 3]
    assert ErrorCode.ABNORMAL == 0 and ErrorCode.TIMEOUT == 3


def test_names_are_utf8_byte_counted() -> None:
    message = Request(b"0001", "h\u00e9\u263a", b"")
    wire = encode(message)
    assert wire == b"r0001006h\xc3\xa9\xe2\x98\xba00000000"
    assert connected().receive_data(wire) == [message]
    longest = Notification("n" * MAX_NAME_SIZE, b"x")
    assert encode(longest).startswith(b"nfff")
    assert connected().receive_data(encode(longest)) == [longest]


def test_mixed_case_hex_accepted_on_receive() -> None:
    conn = connected()
    assert conn.receive_data(b"R00010000000A" + b"x" * 10 + b"hFfFfDeAdBeEf") == [
        Result(b"0001", b"x" * 10),
        Heartbeat(0xFFFF, 0xDEADBEEF),
    ]
    assert conn.receive_data(b"n00A" + b"a" * 10 + b"00000000") == [Notification("a" * 10, b"")]


def test_input_may_be_bytearray_or_memoryview() -> None:
    conn = connected()
    wire = encode(Request(b"0001", "echo", b"hi"))
    assert conn.receive_data(bytearray(wire)) == conn.receive_data(memoryview(wire))


def test_payload_bytes_like_is_sent_as_bytes() -> None:
    header, payload = encode_parts(Result(b"0001", bytearray(b"ab")))  # type: ignore[arg-type]
    assert (header, payload) == (b"R000100000002", b"ab") and type(payload) is bytes
    assert encode(Result(b"0001", memoryview(b"ab"))) == b"R000100000002ab"  # type: ignore[arg-type]


# --- version and connection state ---------------------------------------------------


def test_handshake_and_peer_version() -> None:
    conn = GotalkConnection()
    assert conn.handshake() == b"01" == VERSION
    assert conn.peer_version is None
    assert conn.receive_data(b"0") == []
    assert conn.peer_version is None
    assert conn.receive_data(b"1") == []
    assert conn.peer_version == b"01"


@pytest.mark.parametrize("version", [b"02", b"00", b"10", b"xx", b"1", b"0x", b"\xff\xff"])
def test_unsupported_versions(version: bytes) -> None:
    conn = GotalkConnection()
    with pytest.raises(UnsupportedVersion) as info:
        conn.receive_data(version)
    assert info.value.code == ErrorCode.UNSUPPORTED_PROTOCOL
    assert conn.peer_version is None


def test_dead_after_error_raises_the_same_error_again() -> None:
    conn = connected()
    assert conn.receive_data(b"R000100000001") == []
    assert conn.receive_data(b"x") == [Result(b"0001", b"x")]
    with pytest.raises(MalformedMessage) as first:
        conn.receive_data(b"z")  # no such type
    assert conn.error is first.value
    assert first.value.code == 2
    assert conn.buffered == 0
    for more in (b"", b"R000100000000", b"01"):
        with pytest.raises(MalformedMessage) as again:
            conn.receive_data(more)
        assert again.value is first.value
    # Sending stays possible: the core writes its fault before closing.
    assert conn.fault(first.value.code) == b"f00000002"
    assert conn.send(Result(b"0001", b"")) == b"R000100000000"


def test_an_error_drops_the_rest_of_its_chunk() -> None:
    """The connection is closing anyway; the error is raised at once rather than later."""
    conn = connected()
    with pytest.raises(MalformedMessage):
        conn.receive_data(b"R000200000000?")
    assert conn.buffered == 0


@pytest.mark.parametrize(
    "wire",
    [
        b"?",
        b"r0001\x00\x00\x00",
        b"r0001 04echo00000000",
        b"r0001-04echo00000000",
        b"r0001004echo+0000000",
        b"r0001004echo 0000000",
        b"r0001004echo0x000000",
        b"r0001004echo0000_000",
        b"r0001002\xff\xfe00000000",
        b"s0001001\x8000000000",
        b"n002\xc3(00000000",
        b"R0001000000-1",
        b"e0001zzzzzzzz00000000",
        b"h0002 4d7de9a",
        b"f0000000g",
        b"P000100000000",
    ],
)
def test_malformed_input_raises_code_2(wire: bytes) -> None:
    conn = connected()
    with pytest.raises(MalformedMessage) as info:
        conn.receive_data(wire)
    assert info.value.code == ErrorCode.INVALID_MESSAGE
    assert isinstance(info.value, ProtocolError)


def test_error_raised_as_soon_as_decidable() -> None:
    """Unknown type from its first byte; a bad name size from the 8th; no waiting."""
    with pytest.raises(MalformedMessage):
        connected().receive_data(b"x")
    conn = connected()
    assert conn.receive_data(b"r0001zz") == []
    with pytest.raises(MalformedMessage):
        conn.receive_data(b"z")


# --- limits -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"R0001%08x",
        b"p0001%08x",
        b"S0001%08x",
        b"E0001%08x",
        b"r0001004echo%08x",
        b"s0001004echo%08x",
        b"e000100001388%08x",
        b"n004note%08x",
    ],
)
def test_max_size_enforced_from_header_before_payload(header: bytes) -> None:
    max_size = 1000
    conn = connected(max_size)
    wire = header % (max_size + 1)
    with pytest.raises(MessageTooLarge) as info:
        conn.receive_data(wire)  # the header alone: not one payload byte fed
    assert info.value.code == ErrorCode.INVALID_MESSAGE
    assert conn.buffered == 0

    # Fed a byte at a time, it fails on the header's last byte, with only the header held.
    conn = connected(max_size)
    for byte in wire[:-1]:
        assert conn.receive_data(bytes([byte])) == []
        assert conn.buffered <= len(wire)
    with pytest.raises(MessageTooLarge):
        conn.receive_data(wire[-1:])

    # Exactly max_size is fine.
    conn = connected(max_size)
    message = conn.receive_data(header % max_size + b"x" * max_size)
    assert len(message) == 1 and message[0].payload == b"x" * max_size  # type: ignore[union-attr]


def test_too_large_never_allocates_the_announced_size() -> None:
    """A header announcing a large payload costs what has arrived, not what it announces;
    one announcing more than max_size fails before any of it is read."""
    assert GotalkConnection().max_size == DEFAULT_MAX_SIZE == 16 * 1024 * 1024
    conn = connected()
    tracemalloc.start()
    try:
        assert conn.receive_data(b"Rabcd00ffffff" + b"x" * 1000) == []  # 16 MiB - 1 announced
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert conn.buffered <= 13 + 1000
    assert peak < 256 * 1024, peak
    with pytest.raises(MessageTooLarge):
        connected().receive_data(b"Rabcd01000001")  # max_size + 1


def test_buffer_holds_at_most_one_partial_message() -> None:
    max_size = 64
    conn = connected(max_size)
    big = encode(Request(b"0001", "echo", b"y" * max_size))
    many = b"".join(encode(Result(b"%04d" % n, b"z" * 40)) for n in range(100))
    # Partial first message, then one chunk completing it plus many more plus a partial.
    assert conn.receive_data(big[:10]) == []
    assert conn.buffered == 10
    out = conn.receive_data(big[10:] + many + big[:-1])
    assert len(out) == 101
    assert conn.buffered == len(big) - 1 <= 1 + 4 + 3 + 4 + 8 + max_size
    assert conn.receive_data(big[-1:]) == [Request(b"0001", "echo", b"y" * max_size)]
    assert conn.buffered == 0


def test_large_payload_in_chunks() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = encode(Result(b"0001", payload))
    conn = connected(len(payload))
    out: list[Message] = []
    for i in range(0, len(wire), 65536):
        out += conn.receive_data(wire[i : i + 65536])
        assert conn.buffered <= 13 + len(payload)
    assert out == [Result(b"0001", payload)]
    assert conn.buffered == 0


def test_max_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        GotalkConnection(max_size=-1)
    zero = connected(0)
    assert zero.receive_data(b"R000100000000") == [Result(b"0001", b"")]
    with pytest.raises(MessageTooLarge):
        zero.receive_data(b"R000100000001")


# --- bad sends ----------------------------------------------------------------------


class _Huge(bytes):
    """Claims 16**8 bytes without allocating them."""

    def __len__(self) -> int:
        return 16**8


@pytest.mark.parametrize(
    "message",
    [
        Request(b"001", "echo", b""),
        Request(b"00001", "echo", b""),
        StreamRequest(b"", "echo", b""),
        StreamRequestPart(b"12345", b""),
        Result(b"abc", b""),
        StreamResult(b"", b""),
        ErrorResult(b"12", b""),
        RetryResult(b"1", 0, b""),
        Request(b"0001", "x" * (MAX_NAME_SIZE + 1), b""),
        Request(b"0001", "\u00e9" * 2048, b""),  # 2048 chars, 4096 UTF-8 bytes
        Notification("n" * 4096, b""),
        Request(b"0001", "\ud800", b""),  # lone surrogate: not encodable
        Notification("\udcff", b""),
        Request(b"0001", "echo", _Huge()),
        StreamRequest(b"0001", "echo", _Huge()),
        StreamRequestPart(b"0001", _Huge()),
        Result(b"0001", _Huge()),
        StreamResult(b"0001", _Huge()),
        ErrorResult(b"0001", _Huge()),
        RetryResult(b"0001", 0, _Huge()),
        Notification("n", _Huge()),
        RetryResult(b"0001", -1, b""),
        RetryResult(b"0001", 16**8, b""),
        Heartbeat(-1, 0),
        Heartbeat(0x10000, 0),
        Heartbeat(0, -1),
        Heartbeat(0, 2**32),
        Fault(-1),
        Fault(2**32),
    ],
    ids=repr,
)
def test_unsendable_messages_raise_local_protocol_error(message: Message) -> None:
    with pytest.raises(LocalProtocolError):
        encode(message)
    with pytest.raises(LocalProtocolError):
        encode_parts(message)
    with pytest.raises(LocalProtocolError):
        GotalkConnection().send(message)
    assert not issubclass(LocalProtocolError, ProtocolError)


def test_fault_helper_validates_the_code() -> None:
    conn = GotalkConnection()
    assert conn.fault(ErrorCode.ABNORMAL) == b"f00000000"
    assert conn.fault(0xFFFFFFFF) == b"fffffffff"
    with pytest.raises(LocalProtocolError):
        conn.fault(2**32)


def test_limits_at_the_edge_are_sendable() -> None:
    assert encode(RetryResult(b"0001", 0xFFFFFFFF, b"")) == b"e0001ffffffff00000000"
    assert encode(Heartbeat(0xFFFF, 0xFFFFFFFF)) == b"hffffffffffff"


def test_encoding_a_non_message_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode(b"r0001004echo00000000")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_parts(object())  # type: ignore[arg-type]

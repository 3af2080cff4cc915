"""Byte-exact Gotalk exchanges captured from the real peers (rsms/gotalk v1.3.7, gotalk.js
v1.2.1), checked in both directions.

Each scenario of the transcript file is copied as bytes (gotalk_scenarios.py, and the
sessions captured through proxies in gotalk_captures.py), one entry per ``sendall()`` or
WebSocket frame, the peer's version first. For each side of each scenario:

- decoding what that side sent (in its original chunks, one byte at a time, and all at
  once) gives the expected messages, or the expected error;
- encoding those messages gives exactly the bytes that side sent (lowercase hex is
  canonical), and for WebSocket captures :func:`encode_parts` gives exactly its frames.
"""

from __future__ import annotations

from typing import cast

import pytest

from tests.gotalk_captures import CAPTURES
from tests.gotalk_scenarios import HELLO, SCRIPTED, Flow
from wire.errors import MalformedMessage, ProtocolError, UnsupportedVersion
from wire.gotalk import (
    VERSION,
    ErrorCode,
    Fault,
    GotalkConnection,
    Heartbeat,
    Message,
    Request,
    RetryResult,
    StreamRequest,
    StreamRequestPart,
    encode,
    encode_parts,
)

SCENARIOS = [*SCRIPTED, *CAPTURES]

SIDES = [
    pytest.param(flow, id=f"{scenario.name} [{side}]")
    for scenario in SCENARIOS
    for side, flow in (("client", scenario.client), ("server", scenario.server))
]
GOOD_SIDES = [p for p in SIDES if cast(Flow, p.values[0]).error is None]


def decode_chunks(
    chunks: list[bytes], pending: int = 0
) -> tuple[list[Message], ProtocolError | None]:
    """Feed ``chunks`` to a fresh connection; return the messages and the error, if any."""
    conn = GotalkConnection()
    messages: list[Message] = []
    for chunk in chunks:
        try:
            messages += conn.receive_data(chunk)
        except ProtocolError as exc:
            return messages, exc
    assert conn.peer_version == VERSION
    assert conn.buffered == pending
    return messages, None


def as_one_byte_chunks(chunks: tuple[bytes, ...]) -> list[bytes]:
    return [bytes([b]) for b in b"".join(chunks)]


@pytest.mark.parametrize("flow", SIDES)
@pytest.mark.parametrize("chunking", ["as sent", "one byte at a time", "all at once"])
def test_decode(flow: Flow, chunking: str) -> None:
    if chunking == "as sent":
        chunks = list(flow.chunks)
    elif chunking == "one byte at a time":
        chunks = as_one_byte_chunks(flow.chunks)
    else:
        chunks = [b"".join(flow.chunks)]
    messages, error = decode_chunks(chunks, flow.pending)
    if flow.error is None:
        assert error is None
        assert messages == list(flow.messages)
    else:
        cls, code = flow.error
        assert type(error) is cls
        assert error.code == code
        # Messages completed in earlier chunks were delivered; none after the error.
        assert messages == list(flow.messages)


@pytest.mark.parametrize("flow", GOOD_SIDES)
def test_encode(flow: Flow) -> None:
    assert flow.chunks[0][:2] == GotalkConnection().handshake() == VERSION
    sent = b"".join(flow.chunks)[2 : -flow.pending or None]
    expected = sent if flow.canonical is None else flow.canonical
    assert b"".join(encode(m) for m in flow.messages) == expected
    conn = GotalkConnection()
    assert b"".join(conn.send(m) for m in flow.messages) == expected


@pytest.mark.parametrize("flow", [p for p in GOOD_SIDES if cast(Flow, p.values[0]).framed])
def test_encode_parts_gives_websocket_frames(flow: Flow) -> None:
    frames: list[bytes] = []
    for message in flow.messages:
        header, payload = encode_parts(message)
        frames.append(header)
        if payload:
            frames.append(payload)
    assert frames == list(flow.chunks[1:])
    conn = GotalkConnection()
    assert [conn.send_parts(m) for m in flow.messages] == [encode_parts(m) for m in flow.messages]


def test_uppercase_size_decodes_and_reencodes_lowercase() -> None:
    conn = GotalkConnection()
    (message,) = conn.receive_data(b'01r0006004echo0000000A"abcdefgh"')
    assert message == Request(b"0006", "echo", b'"abcdefgh"')
    assert encode(message) == b'r0006004echo0000000a"abcdefgh"'


def test_heartbeat_fields_match_the_seed_example() -> None:
    """h000254d7de9a is load 2 at 2015-02-08 22:09:30 UTC."""
    (beat,) = decode_chunks([b"01", b"h000254d7de9a"])[0]
    assert beat == Heartbeat(load=2, time=1423433370)
    assert encode(Heartbeat(0, 0x6B025D6D)) == b"h00006b025d6d"


def test_retry_wait_is_milliseconds_field() -> None:
    (retry,) = decode_chunks([b"01e000100000da600000012request rate limit"])[0]
    assert isinstance(retry, RetryResult)
    assert (retry.id, retry.wait, retry.payload) == (b"0001", 3494, b"request rate limit")
    (js_retry,) = decode_chunks([b"01e00000000116000000012request rate limit"])[0]
    assert js_retry == RetryResult(b"0000", 4448, b"request rate limit")


def test_go_client_ids_are_little_endian_counters() -> None:
    capture = next(s for s in SCENARIOS if s.name.startswith("CAPTURE: real Go gotalk client"))
    ids = [m.id for m in decode_chunks(list(capture.client.chunks))[0] if isinstance(m, Request)]
    assert [int.from_bytes(i, "little") for i in ids] == list(range(7))


def test_gotalk_js_ids_are_base36_text_and_bang_for_streams() -> None:
    capture = next(s for s in SCENARIOS if s.name.startswith("CAPTURE: real gotalk.js 1.2.1"))
    messages = decode_chunks(list(capture.client.chunks))[0]
    assert {m.id for m in messages if isinstance(m, Request)} == {b"000%d" % n for n in range(10)}
    assert {m.id for m in messages if isinstance(m, StreamRequest | StreamRequestPart)} == {b"!000"}


@pytest.mark.parametrize(
    ("code", "wire"),
    [
        (ErrorCode.ABNORMAL, b"f00000000"),
        (ErrorCode.UNSUPPORTED_PROTOCOL, b"f00000001"),
        (ErrorCode.INVALID_MESSAGE, b"f00000002"),
        (ErrorCode.TIMEOUT, b"f00000003"),
    ],
)
def test_faults(code: ErrorCode, wire: bytes) -> None:
    conn = GotalkConnection()
    assert conn.fault(code) == wire == encode(Fault(code))
    assert conn.receive_data(b"01" + wire) == [Fault(code)]


@pytest.mark.parametrize(
    ("name", "received", "cls", "code"),
    [
        ("wrong version 02", b"02", UnsupportedVersion, 1),
        ("wrong version 'xx' (non-hex)", b"xx", UnsupportedVersion, 1),
        ("unknown message type 'x'", b"01x000100000000", MalformedMessage, 2),
        ("malformed: non-hex text3 size", b"01r0001zzzecho00000007", MalformedMessage, 2),
        ("malformed: non-hex payload size", b'01r0001004echo0000000g"hello"', MalformedMessage, 2),
    ],
)
def test_errors_answer_with_the_fault_real_peers_send(
    name: str, received: bytes, cls: type[ProtocolError], code: int
) -> None:
    """The core answers a protocol error with ``fault(exc.code)``: f00000001 for a bad
    version (what gotalk.js sends), f00000002 for an invalid message (what Go sends)."""
    conn = GotalkConnection()
    with pytest.raises(cls) as info:
        conn.receive_data(received)
    assert info.value.code == code
    assert conn.fault(info.value.code) == b"f%08x" % code


def test_short_header_then_silence_just_waits() -> None:
    conn = GotalkConnection()
    assert conn.receive_data(b"01") == []
    assert conn.receive_data(b"r0001") == []
    assert conn.buffered == 5
    assert conn.error is None
    # ...and completes when the rest arrives.
    assert conn.receive_data(b'004echo00000007"hello"') == [HELLO]
    assert conn.buffered == 0

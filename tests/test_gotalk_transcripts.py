"""Byte-exact Gotalk exchanges captured from the real peers (rsms/gotalk v1.3.7, gotalk.js
v1.2.1), checked in both directions.

Each scenario of the transcript file is copied here as bytes, one entry per ``sendall()`` or
WebSocket frame, the peer's version first. For each side of each scenario:

- decoding what that side sent (in its original chunks, one byte at a time, and all at
  once) gives the expected messages, or the expected error;
- encoding those messages gives exactly the bytes that side sent (lowercase hex is
  canonical), and for WebSocket captures :func:`encode_parts` gives exactly its frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from wire.errors import MalformedMessage, ProtocolError, UnsupportedVersion
from wire.gotalk import (
    VERSION,
    ErrorCode,
    ErrorResult,
    Fault,
    GotalkConnection,
    Heartbeat,
    Message,
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


@dataclass(frozen=True)
class Flow:
    """What one side of a scenario sent, and what it means.

    ``chunks``: each sendall() (TCP) or frame (WebSocket), the version first.
    ``framed``: WebSocket frames of one header or one payload each (the gotalk.js and Go
    server layout), so ``encode_parts`` must reproduce them frame for frame.
    ``error``: (exception class, code) the bytes must raise after ``messages``.
    ``canonical``: the bytes our encoder writes for ``messages`` when they differ from
    what the peer sent (uppercase hex on the wire).
    ``pending``: trailing bytes of an incomplete message, left buffered without error.
    """

    chunks: tuple[bytes, ...]
    messages: tuple[Message, ...] = ()
    framed: bool = False
    error: tuple[type[ProtocolError], int] | None = None
    canonical: bytes | None = None
    pending: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    client: Flow
    server: Flow


HELLO = Request(b"0001", "echo", b'"hello"')
HELLO_RESULT = Result(b"0001", b'"hello"')
HELLO_FLOW_C = Flow((b"01", b'r0001004echo00000007"hello"'), (HELLO,))
HELLO_FLOW_S = Flow((b"01", b'R000100000007"hello"'), (HELLO_RESULT,))
SERVER_SILENT = Flow((b"01",))


def le(n: int) -> bytes:
    """The Go client's request id: a little-endian uint32 counter as raw bytes."""
    return n.to_bytes(4, "little")


SCENARIOS = [
    Scenario("handshake + echo (brief's example)", HELLO_FLOW_C, HELLO_FLOW_S),
    Scenario(
        "send version and request in ONE write (pipelined handshake)",
        Flow((b'01r0001004echo00000007"hello"',), (HELLO,)),
        HELLO_FLOW_S,
    ),
    Scenario(
        "greet (JSON op)",
        Flow(
            (b"01", b'r0002005greet0000000e{"name":"Bob"}'),
            (Request(b"0002", "greet", b'{"name":"Bob"}'),),
        ),
        Flow(
            (b"01", b'R000200000018{"greeting":"Hello Bob"}'),
            (Result(b"0002", b'{"greeting":"Hello Bob"}'),),
        ),
    ),
    Scenario(
        "greet with invalid JSON payload",
        Flow((b"01", b"r0002005greet00000003{x}"), (Request(b"0002", "greet", b"{x}"),)),
        Flow(
            (b"01", b"E000200000019unexpected parameter type"),
            (ErrorResult(b"0002", b"unexpected parameter type"),),
        ),
    ),
    Scenario(
        "echo with empty payload",
        Flow((b"01", b"r0005004echo00000000"), (Request(b"0005", "echo", b""),)),
        Flow((b"01", b"R000500000000"), (Result(b"0005", b""),)),
    ),
    Scenario(
        "echo with UPPERCASE hex size (0000000A)",
        Flow(
            (b"01", b'r0006004echo0000000A"abcdefgh"'),
            (Request(b"0006", "echo", b'"abcdefgh"'),),
            canonical=b'r0006004echo0000000a"abcdefgh"',
        ),
        Flow((b"01", b'R00060000000a"abcdefgh"'), (Result(b"0006", b'"abcdefgh"'),)),
    ),
    Scenario(
        "unknown operation",
        Flow((b"01", b"r0003004nope00000002{}"), (Request(b"0003", "nope", b"{}"),)),
        Flow(
            (b"01", b'E000300000018unknown operation "nope"'),
            (ErrorResult(b"0003", b'unknown operation "nope"'),),
        ),
    ),
    Scenario(
        "handler returns error",
        Flow((b"01", b"r0004004fail00000000"), (Request(b"0004", "fail", b""),)),
        Flow(
            (b"01", b"E000400000014something went wrong"),
            (ErrorResult(b"0004", b"something went wrong"),),
        ),
    ),
    Scenario(
        "server sends notification (op notifyme)",
        Flow(
            (b"01", b'r0007008notifyme00000007{"x":1}'),
            (Request(b"0007", "notifyme", b'{"x":1}'),),
        ),
        Flow(
            (b"01", b'n004note00000007{"x":1}R000700000004"ok"'),
            (Notification("note", b'{"x":1}'), Result(b"0007", b'"ok"')),
        ),
    ),
    Scenario(
        "client notification (no reply expected) then echo",
        Flow(
            (b"01", b"n005hello00000002{}", b"r0008004echo00000001x"),
            (Notification("hello", b"{}"), Request(b"0008", "echo", b"x")),
        ),
        Flow((b"01", b"R000800000001x"), (Result(b"0008", b"x"),)),
    ),
    Scenario(
        "client heartbeat (no reply expected) then echo",
        Flow(
            (b"01", b"h000254d7de9a", b"r0009004echo00000001y"),
            (Heartbeat(2, 0x54D7DE9A), Request(b"0009", "echo", b"y")),
        ),
        Flow((b"01", b"R000900000001y"), (Result(b"0009", b"y"),)),
    ),
    Scenario(
        "stream request s + p parts + empty p (end)",
        Flow(
            (
                b"01",
                b"s000a006stream00000005part1",
                b"p000a00000005part2",
                b"p000a00000000",
            ),
            (
                StreamRequest(b"000a", "stream", b"part1"),
                StreamRequestPart(b"000a", b"part2"),
                StreamRequestPart(b"000a", b""),
            ),
        ),
        Flow(
            (b"01", b"S000a00000005part1", b"S000a00000005part2", b"S000a00000000"),
            (
                StreamResult(b"000a", b"part1"),
                StreamResult(b"000a", b"part2"),
                StreamResult(b"000a", b""),
            ),
        ),
    ),
    Scenario(
        "pipelining: slow request then fast request (out-of-order replies)",
        Flow(
            (b'01r000b005sleep0000000a{"ms":300}r000c004echo00000004fast',),
            (Request(b"000b", "sleep", b'{"ms":300}'), Request(b"000c", "echo", b"fast")),
        ),
        Flow(
            (b"01", b"R000c00000004fast", b'R000b0000000d{"slept":300}'),
            (Result(b"000c", b"fast"), Result(b"000b", b'{"slept":300}')),
        ),
    ),
    Scenario(
        "binary (non-ASCII) request ID bytes are echoed verbatim",
        Flow(
            (b"01", b"r\x00\x01\xfe\xff004echo00000001z"),
            (Request(b"\x00\x01\xfe\xff", "echo", b"z"),),
        ),
        Flow((b"01", b"R\x00\x01\xfe\xff00000001z"), (Result(b"\x00\x01\xfe\xff", b"z"),)),
    ),
    Scenario(
        # The codec decodes it; refusing a part for an unknown stream is the core's job.
        "stream part for unknown stream id",
        Flow((b"01", b"pzzzz00000003abc"), (StreamRequestPart(b"zzzz", b"abc"),)),
        SERVER_SILENT,
    ),
    Scenario(
        "unknown message type 'x'",
        Flow((b"01", b"x000100000000"), error=(MalformedMessage, ErrorCode.INVALID_MESSAGE)),
        Flow((b"01", b"f00000002"), (Fault(ErrorCode.INVALID_MESSAGE),)),
    ),
    Scenario(
        "malformed: non-hex text3 size",
        Flow((b"01", b"r0001zzzecho00000007"), error=(MalformedMessage, 2)),
        SERVER_SILENT,
    ),
    Scenario(
        "malformed: non-hex payload size",
        Flow((b"01", b'r0001004echo0000000g"hello"'), error=(MalformedMessage, 2)),
        SERVER_SILENT,
    ),
    Scenario(
        "malformed: header shorter than 13 bytes, then silence",
        Flow((b"01", b"r0001"), pending=5),  # a partial header waits: no message, no error
        SERVER_SILENT,
    ),
    Scenario(
        "wrong version 02",
        Flow((b"02", b'r0001004echo00000007"hello"'), error=(UnsupportedVersion, 1)),
        SERVER_SILENT,
    ),
    Scenario(
        "wrong version 'xx' (non-hex)",
        Flow((b"xx",), error=(UnsupportedVersion, ErrorCode.UNSUPPORTED_PROTOCOL)),
        SERVER_SILENT,
    ),
    Scenario(
        "client sends ProtocolError f00000002",
        Flow((b"01", b"f00000002"), (Fault(ErrorCode.INVALID_MESSAGE),)),
        SERVER_SILENT,
    ),
    Scenario(
        "response message for unknown id (ignored)",
        Flow(
            (b"01", b"RABCD00000002{}", b"r000d004echo00000001q"),
            (Result(b"ABCD", b"{}"), Request(b"000d", "echo", b"q")),
        ),
        Flow((b"01", b"R000d00000001q"), (Result(b"000d", b"q"),)),
    ),
    Scenario(
        "peer with -buflimit 0 -streamlimit 0: RetryResult / streams disabled",
        Flow(
            (b"01", b'r0001004echo00000007"hello"', b"s0002006stream00000001a"),
            (HELLO, StreamRequest(b"0002", "stream", b"a")),
        ),
        Flow(
            (
                b"01",
                b"e000100000da600000012request rate limit",
                b"E00020000001dstream requests not supported",
            ),
            (
                RetryResult(b"0001", 0xDA6, b"request rate limit"),
                ErrorResult(b"0002", b"stream requests not supported"),
            ),
        ),
    ),
    Scenario(
        "peer with -heartbeat 1s: server heartbeats (idle 2.5s)",
        Flow((b"01",)),
        Flow(
            (b"01", b"h00006b025d6d", b"h00006b025d6e", b"h00006b025d6f"),
            (Heartbeat(0, 0x6B025D6D), Heartbeat(0, 0x6B025D6E), Heartbeat(0, 0x6B025D6F)),
        ),
    ),
    Scenario(
        "peer with -readtimeout 1s: idle client gets timeout ProtocolError",
        Flow((b"01",)),
        Flow((b"01", b"f00000003"), (Fault(ErrorCode.TIMEOUT),)),
    ),
    Scenario(
        "WS: binary frames, version + echo + greet + unknown op + notifyme + stream",
        # The client split one header over two frames: the Go reader treats frames as a
        # byte stream, and so do we.
        Flow((b"01", b"r0001004echo", b"00000007", b'"hello"'), (HELLO,)),
        Flow((b"01", b"R000100000007", b'"hello"'), (HELLO_RESULT,), framed=True),
    ),
    Scenario(
        "WS: header and payload in separate frames (as gotalk.js does)",
        Flow(
            (
                b"01",
                b"r0001004echo00000007",
                b'"hello"',
                b"r0002005greet0000000e",
                b'{"name":"Bob"}',
                b"r0003004nope00000000",
                b"r0004008notifyme00000002",
                b"{}",
                b"s0005006stream00000005",
                b"part1",
                b"p000500000000",
            ),
            (
                HELLO,
                Request(b"0002", "greet", b'{"name":"Bob"}'),
                Request(b"0003", "nope", b""),
                Request(b"0004", "notifyme", b"{}"),
                StreamRequest(b"0005", "stream", b"part1"),
                StreamRequestPart(b"0005", b""),
            ),
            framed=True,
        ),
        Flow(
            (
                b"01",
                b"R000100000007",
                b'"hello"',
                b"R000200000018",
                b'{"greeting":"Hello Bob"}',
                b"E000300000018",
                b'unknown operation "nope"',
                b"n004note00000002",
                b"{}",
                b"R000400000004",
                b'"ok"',
                b"S000500000005",
                b"part1",
                b"S000500000000",
            ),
            (
                HELLO_RESULT,
                Result(b"0002", b'{"greeting":"Hello Bob"}'),
                ErrorResult(b"0003", b'unknown operation "nope"'),
                Notification("note", b"{}"),
                Result(b"0004", b'"ok"'),
                StreamResult(b"0005", b"part1"),
                StreamResult(b"0005", b""),
            ),
            framed=True,
        ),
    ),
    Scenario(
        "WS: header+payload in ONE frame",
        HELLO_FLOW_C,
        Flow((b"01", b"R000100000007", b'"hello"'), (HELLO_RESULT,), framed=True),
    ),
    Scenario(
        "WS: TEXT frames from client",
        HELLO_FLOW_C,
        Flow((b"01", b"R000100000007", b'"hello"'), (HELLO_RESULT,), framed=True),
    ),
    Scenario(
        "WS: unknown message type",
        Flow((b"01", b"x000100000000"), error=(MalformedMessage, 2)),
        Flow((b"01", b"f00000002"), (Fault(ErrorCode.INVALID_MESSAGE),), framed=True),
    ),
    Scenario(
        "CAPTURE: real Go gotalk client (gotalk-bench) via a logging TCP proxy",
        Flow(
            (
                b"01",
                b'r\x00\x00\x00\x00004echo00000004"hi"',
                b'r\x01\x00\x00\x00004echo00000004"hi"',
                b"r\x02\x00\x00\x00004echo00000004",
                b'"hi"',
                b"h00006b025d94",
                b'r\x03\x00\x00\x00004echo00000004"hi"r\x04\x00\x00\x00004echo00000004"hi"',
                b'r\x05\x00\x00\x00004echo00000004"hi"r\x06\x00\x00\x00004echo00000004"hi"',
            ),
            (
                Request(le(0), "echo", b'"hi"'),
                Request(le(1), "echo", b'"hi"'),
                Request(le(2), "echo", b'"hi"'),
                Heartbeat(0, 0x6B025D94),
                *(Request(le(n), "echo", b'"hi"') for n in range(3, 7)),
            ),
        ),
        Flow(
            (
                b"01",
                b'R\x00\x00\x00\x0000000004"hi"',
                b'R\x01\x00\x00\x0000000004"hi"',
                b'R\x02\x00\x00\x0000000004"hi"',
                b'R\x04\x00\x00\x0000000004"hi"R\x03\x00\x00\x0000000004"hi"',
                b'R\x06\x00\x00\x0000000004"hi"R\x05\x00\x00\x0000000004"hi"',
            ),
            tuple(Result(le(n), b'"hi"') for n in (0, 1, 2, 4, 3, 6, 5)),
        ),
    ),
    Scenario(
        "CAPTURE: Go client gotalk.Connect (DefaultLimits) idle -> client times out",
        Flow(
            (
                b"01",
                b'r\x00\x00\x00\x00004echo00000003"x"',
                b"h00006b025ea2",
                b"h00006b025eb6",
                b"f00000003",
            ),
            (
                Request(le(0), "echo", b'"x"'),
                Heartbeat(0, 0x6B025EA2),
                Heartbeat(0, 0x6B025EB6),
                Fault(ErrorCode.TIMEOUT),
            ),
        ),
        Flow(
            (b"01", b"R\x00\x00\x00\x0000000003", b'"x"'),
            (Result(le(0), b'"x"'),),
            framed=True,  # the Go server wrote header and payload apart here, as on WS
        ),
    ),
    Scenario(
        "CAPTURE: real gotalk.js 1.2.1 in Node 20 via WS-decoding proxy",
        Flow(
            (
                b"01",
                b"r0000004echo00000007",
                b'"hello"',
                b"h00006b025e5e",
                b"r0001005greet0000000f",
                b'{"name":"Node"}',
                b"r0002004fail00000004",
                b"null",
                b"r0003004nope00000004",
                b"null",
                b"r0004008notifyme00000007",
                b'{"x":1}',
                b"r0005004echo00000008",
                b"raw text",
                b"s!000006stream00000005",
                b"part1",
                b"p!00000000005",
                b"part2",
                b"p!00000000000",
                b"r0006004echo00000007",
                b'"hello"',
                b"r0007004echo00000007",
                b'"hello"',
                b"r0008004echo00000007",
                b'"hello"',
                b"r0009004echo00000007",
                b'"hello"',
            ),
            (
                Request(b"0000", "echo", b'"hello"'),
                Heartbeat(0, 0x6B025E5E),
                Request(b"0001", "greet", b'{"name":"Node"}'),
                Request(b"0002", "fail", b"null"),
                Request(b"0003", "nope", b"null"),
                Request(b"0004", "notifyme", b'{"x":1}'),
                Request(b"0005", "echo", b"raw text"),
                StreamRequest(b"!000", "stream", b"part1"),
                StreamRequestPart(b"!000", b"part2"),
                StreamRequestPart(b"!000", b""),
                *(Request(b"000%d" % n, "echo", b'"hello"') for n in range(6, 10)),
            ),
            framed=True,
        ),
        Flow(
            (
                b"01",
                b"R000000000007",
                b'"hello"',
                b"R000100000019",
                b'{"greeting":"Hello Node"}',
                b"E000200000014",
                b"something went wrong",
                b"E000300000018",
                b'unknown operation "nope"',
                b"n004note00000007",
                b'{"x":1}',
                b"R000400000004",
                b'"ok"',
                b"R000500000008",
                b"raw text",
                b"S!00000000005",
                b"part1",
                b"S!00000000005",
                b"part2",
                b"S!00000000000",
                b"R000600000007",
                b'"hello"',
                b"R000700000007",
                b'"hello"',
                b"R000900000007",
                b'"hello"',
                b"R000800000007",
                b'"hello"',
            ),
            (
                Result(b"0000", b'"hello"'),
                Result(b"0001", b'{"greeting":"Hello Node"}'),
                ErrorResult(b"0002", b"something went wrong"),
                ErrorResult(b"0003", b'unknown operation "nope"'),
                Notification("note", b'{"x":1}'),
                Result(b"0004", b'"ok"'),
                Result(b"0005", b"raw text"),
                StreamResult(b"!000", b"part1"),
                StreamResult(b"!000", b"part2"),
                StreamResult(b"!000", b""),
                *(Result(b"000%d" % n, b'"hello"') for n in (6, 7, 9, 8)),
            ),
            framed=True,
        ),
    ),
    Scenario(
        "CAPTURE: gotalk.js receiving a RetryResult (peer -buflimit 0)",
        Flow(
            (b"01", b"r0000004echo00000004", b'"hi"', b"f00000002"),
            (Request(b"0000", "echo", b'"hi"'), Fault(ErrorCode.INVALID_MESSAGE)),
            framed=True,
        ),
        Flow(
            (b"01", b"e00000000116000000012", b"request rate limit"),
            (RetryResult(b"0000", 0x1160, b"request rate limit"),),
            framed=True,
        ),
    ),
    Scenario(
        # The codec is stateless: a duplicate in-flight stream id is the core's to refuse
        # (it crashed the Go server process).
        "duplicate in-flight stream requestID",
        Flow(
            (b"01s0001006stream00000001a", b"s0001006stream00000001b"),
            (StreamRequest(b"0001", "stream", b"a"), StreamRequest(b"0001", "stream", b"b")),
        ),
        Flow((b"01", b"S000100000001a"), (StreamResult(b"0001", b"a"),)),
    ),
]

SIDES = [
    pytest.param(flow, id=f"{scenario.name} [{side}]")
    for scenario in SCENARIOS
    for side, flow in (("client", scenario.client), ("server", scenario.server))
]
GOOD_SIDES = [p for p in SIDES if p.values[0].error is None]


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


@pytest.mark.parametrize("flow", [p for p in GOOD_SIDES if p.values[0].framed])
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

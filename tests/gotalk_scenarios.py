"""The Gotalk transcripts' format (:class:`Flow`, :class:`Scenario`) and the scenarios of
the transcript file written out as bytes: what the real peers (rsms/gotalk v1.3.7,
gotalk.js v1.2.1) send and answer over TCP and WebSocket, errors and limits included.

The whole sessions captured through proxies are in gotalk_captures.py;
test_gotalk_transcripts.py checks both.
"""

from __future__ import annotations

from dataclasses import dataclass

from wire.errors import MalformedMessage, ProtocolError, UnsupportedVersion
from wire.gotalk import (
    ErrorCode,
    ErrorResult,
    Fault,
    Heartbeat,
    Message,
    Notification,
    Request,
    Result,
    RetryResult,
    StreamRequest,
    StreamRequestPart,
    StreamResult,
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

SCRIPTED = [
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
"""Every scenario of the transcript file but the captured sessions (gotalk_captures.py)."""

"""Whole sessions of the real peers recorded through logging proxies (the CAPTURE:
scenarios of the transcript file): the Go client (gotalk-bench, and gotalk.Connect left
idle) over TCP, gotalk.js 1.2.1 in Node 20 over WebSocket, as bytes, one entry per
``sendall()`` or WebSocket frame.
"""

from __future__ import annotations

from tests.gotalk_scenarios import Flow, Scenario
from wire.gotalk import (
    ErrorCode,
    ErrorResult,
    Fault,
    Heartbeat,
    Notification,
    Request,
    Result,
    RetryResult,
    StreamRequest,
    StreamRequestPart,
    StreamResult,
)


def le(n: int) -> bytes:
    """The Go client's request id: a little-endian uint32 counter as raw bytes."""
    return n.to_bytes(4, "little")


CAPTURES = [
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
]

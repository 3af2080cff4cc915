"""A Chatter peer's SBS payloads cost the server in proportion to their bytes, and only when
a handler takes them: a count the bytes do not back is an error result at once, a payload of
a type no handler takes is not decoded at all, and undecodable control messages cost a
rate-limited warning each."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

import rpc
from rpc.chatter_extension import HELLO
from rpc.logs import violations
from tests.chatter_socket import ChatterSocket
from wire import sbs
from wire.chatter import ChatterConnection, Dialect, Msg

# request HatEventer.MsgRegisterReq, payload: an Array count of 2**30 and nothing else
T = TypeVar("T")

HUGE_COUNT = bytes.fromhex(
    "01258181010100994861744576656e7465722e4d73675265676973746572526571850400000080"
)
# request HatEventer.EventType, payload: an Array count of 2**40 (a MemoryError in hat-sbs)
MEMORY_ERROR = bytes.fromhex(
    "01218181010100944861744576656e7465722e4576656e745479706586200000000080"
)
ANSWER_WITHIN = 0.2  # seconds; hat-sbs took 2.7 s for the first frame


async def within(seconds: float, aw: Awaitable[T]) -> T:
    """``aw``'s result, which must come within ``seconds`` of this process's CPU time (the
    server runs in this loop: decoding the payload would block it, and cost seconds of
    CPU). Not wall time: on a loaded machine the 3-MiB frame's read alone took 0.48 s."""
    started = time.process_time()
    result = await asyncio.wait_for(aw, 10)
    assert time.process_time() - started < seconds, time.process_time() - started
    return result


def registry(**handlers: Any) -> rpc.Registry:
    reg = rpc.Registry()
    reg.handle("echo")(lambda value: value)
    for name, fn in handlers.items():
        reg.handle(name.replace("_", "."))(fn)
    return reg


async def raw_connection(port: int) -> ChatterSocket:
    return await ChatterSocket.connect("127.0.0.1", port, Dialect.CURRENT)


async def error_answer(sock: ChatterSocket, frame: bytes) -> Msg:
    """Send ``frame``'s request as the next message of ``sock``: the error result."""
    (msg,) = ChatterConnection(Dialect.CURRENT).receive_data(frame)
    sock.conn.send(msg.type, msg.data, token=msg.token, last=msg.last)
    sent = sock.conn.data_to_send()
    assert sent == frame or sock.conn.next_id > 2  # the first one goes as given
    sock.writer.write(sent)
    answer = await sock.receive(timeout=5)
    assert answer.type == "PeerwireRpc.Error" and answer.last, answer
    return answer


@pytest.mark.parametrize("handled", [False, True])
async def test_a_count_the_bytes_do_not_back_is_answered_at_once(handled: bool) -> None:
    """Without a handler of the type (unknown operation) and with one (undecodable payload)."""
    seen: list[Any] = []
    handlers = {"HatEventer_MsgRegisterReq": seen.append} if handled else {}
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry(**handlers)) as server:
        url = f"{server.url}?dialect=HatChatter"
        async with rpc.connect(url, registry=rpc.Registry(), reconnect=False) as other:
            assert await other.request("echo", "warm") == "warm"
            sock = await raw_connection(server.url.port)
            answer, echoed = await within(
                ANSWER_WITHIN,
                asyncio.gather(error_answer(sock, HUGE_COUNT), other.request("echo", "still here")),
            )
            assert echoed == "still here"
            expected = b"SBS payload" if handled else b"unknown operation"
            assert expected in answer.data and not seen
            await error_answer(sock, HUGE_COUNT)  # the connection lives on
            assert sock.conn.next_id == 3
            await sock.close()


async def test_a_memory_error_of_hat_sbs_is_an_error_result_not_a_closed_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    types = {"HatEventer_EventType": lambda value: value}
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry(**types)) as server:
        sock = await raw_connection(server.url.port)
        with caplog.at_level(logging.WARNING, logger="peerwire"):
            answer = await error_answer(sock, MEMORY_ERROR)
            assert b"invalid HatEventer.EventType SBS payload" in answer.data
            sock.conn.send("echo", b'"alive"', token=True, last=False)
            sock.flush()
            assert (await sock.receive()).data == b'"alive"'
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        await sock.close()


async def test_a_payload_no_handler_takes_is_not_decoded() -> None:
    """A million empty events (a valid payload of 3 MiB) for a server without a handler
    of their type: decoded, they would take seconds and hundreds of MB."""
    count = 1_000_000
    data = sbs.encode_integer(count) + b"\x80\x80\x80" * count
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        sock = await raw_connection(server.url.port)
        sock.conn.send("HatEventer.MsgRegisterReq", data, token=True, last=False)
        sock.flush()
        answer = await within(ANSWER_WITHIN, sock.receive())
        assert b"unknown operation" in answer.data
        await sock.close()


async def test_undecodable_cancels_cost_a_rate_limited_warning_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    violations.reset()
    async with rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry()) as server:
        sock = await raw_connection(server.url.port)
        sock.conn.send_ping(HELLO)  # the extension: the server takes Cancels
        sock.flush()
        await sock.pump_until(lambda: sock.conn.pongs_received)
        with caplog.at_level(logging.WARNING, logger="peerwire"):
            for _ in range(1000):
                sock.conn.send("PeerwireRpc.Cancel", b"", token=True, last=True)  # no Integer
            sock.conn.send("echo", b'"after"', token=True, last=False)
            sock.flush()
            assert (await sock.receive()).data == b'"after"'  # every Cancel was read
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert 20 <= len(warnings) <= 21, len(warnings)
        assert "PeerwireRpc.Cancel" in warnings[0].getMessage()
        await sock.close()

"""Keep-alive back-off of our browser library (transports/web/gotalk.js) in Node against
servers that accept the WebSocket and then drop it at once.

A connection that brought no message and did not stay up one heartbeat interval does not
reset the back-off, delays are random up to the bound (full jitter), and after a Gotalk
protocol error from the server the client waits 2.5 to 5 s, as gotalk.js waits its longest
delay. Before, every such server got a reconnect every 0.5 s for good.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection

from tests.test_web_js_node import RECORD_RECONNECT_DELAYS, Scripted, run_node

CLOSES = """
const s = gotalk.connection(ADDR);
const errors = [];
await new Promise((resolve) => s.on('close', (e) => {
  errors.push(e && e.message);
  if (errors.length === %d) resolve();
}));
s.close();
return errors;
"""


RECORDED_DELAYS = "Math.random = () => 0.5;\n" + RECORD_RECONNECT_DELAYS


def attempt_times(attempts: list[float]) -> Any:
    def record(connection: ServerConnection, request: Any) -> None:
        attempts.append(time.monotonic())

    return record


async def test_a_protocol_error_waits_the_longest_delay(tmp_path: Path) -> None:
    """`01` then `f00000001` (a version the server does not speak): the next attempts come
    2.5 to 5 s apart (there were 12 in 6 s). Math.random pinned to 0.5: each reconnect asks
    its timer for 3.75 s, and the server sees each gap at least that long."""
    attempts: list[float] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        await ws.send(b"f00000001")
        await ws.wait_closed()

    body = RECORDED_DELAYS + (CLOSES % 3).replace("return errors;", "return [errors, delays];")
    scripted = Scripted(script, process_request=attempt_times(attempts))
    async with scripted as address:
        errors, delays = await run_node(tmp_path, body, address)
    scripted.check()
    assert errors == ["gotalk protocol error: the server sent f00000001"] * 3
    assert delays == [3750] * 3  # BACKOFF_MAX (5 s) times 0.5 + random / 2
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert len(gaps) == 2
    for gap in gaps:
        assert gap >= 3.75 - 0.05, gaps


async def test_drops_at_once_grow_the_delay_with_jitter(tmp_path: Path) -> None:
    """`01`, then a close (1011): each drop doubles the bound (no reset for a connection
    that served nothing), and the delay is Math.random() times it: pinned to 0.5, the
    reconnects wait 0.25, 0.5, 1 and 2 s, then 2.5 (the bound capped at 5 s; there were
    0.5 s each). The delays are those its reconnects asked their timers for; the attempts'
    gaps at the server show it waited each one at least. (A gap's upper bound, 0.4 s over,
    failed once in CI beside a compile: a 0.5-s wait seen as 1.0 s.)"""
    attempts: list[float] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        await ws.close(1011)

    body = RECORDED_DELAYS + (CLOSES % 5).replace("return errors;", "return [errors, delays];")
    scripted = Scripted(script, process_request=attempt_times(attempts))
    async with scripted as address:
        errors, delays = await run_node(tmp_path, body, address)
    scripted.check()
    assert errors == ["connection closed (code 1011)"] * 5
    assert delays == [250, 500, 1000, 2000, 2500]  # the last after the 5th drop: capped
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    assert len(gaps) == 4
    for gap, expected in zip(gaps, [0.25, 0.5, 1.0, 2.0], strict=True):
        assert gap >= expected - 0.05, (gaps, expected)

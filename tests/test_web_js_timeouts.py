"""Our browser library (transports/web/gotalk.js) in Node against servers that stall.

A server that accepts TCP and never answers the upgrade, or upgrades and never sends its
version, fails the attempt after ``connectTimeout``; one that has sent heartbeats and then
nothing at all is closed with a timeout error after three heartbeat intervals; a server
without heartbeats is never cut (Go servers may send none), but ``requestTimeout`` bounds a
request. Each script races what it waits for against a deadline well past the limit, so a
client that never settles fails the test with "not settled" instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from tests.test_web_js_node import Scripted, run_node

# within(promise, ms): the promise's value, or 'not settled' once ms have passed
FAILURE = """
const failure = (e) => [e.message, e.timeout === true, e.code === undefined ? null : e.code];
"""


async def record_until_closed(ws: ServerConnection, seen: list[Any]) -> None:
    """Append every frame but heartbeats to ``seen`` until the client closes, then its
    close code (None: no close frame)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            frame = await ws.recv()
            if not (isinstance(frame, bytes) and frame[:1] == b"h"):
                seen.append(frame)
    seen.append(closed.value.rcvd.code if closed.value.rcvd else None)


async def test_a_server_that_never_answers_the_upgrade(tmp_path: Path) -> None:
    """gotalk.open's callback and a queued request get the timeout error within
    connectTimeout + 1 s; a kept-alive socket rejects its queued request and tries again."""
    accepted: list[float] = []
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(time.monotonic())
        held.append(writer)
        while await reader.read(4096):  # read the upgrade request, never answer it
            pass

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_node(
            tmp_path,
            FAILURE
            + """
            let attempts = 0;
            let retried;
            const third = new Promise((resolve) => { retried = resolve; });
            gotalk.WebSocket = class extends WebSocket {
              constructor(...args) { super(...args); if (++attempts === 3) retried(); }
            };
            const out = {};
            const t0 = Date.now();
            let queued;
            const opened = new Promise((resolve) => {
              const s = gotalk.open(ADDR, (err) => resolve(err ? [Date.now() - t0, failure(err)]
                                                            : 'connected'));
              s.connectTimeout = 500;  // applies to the attempt open() has just begun
              queued = s.request('echo', 1).then(() => 'resolved', failure);
            });
            out.open = await within(opened, 5000);
            out.queued = await within(queued, 1000);
            const k = gotalk.connection(ADDR);
            k.connectTimeout = 500;
            const request = k.request('echo', 2).then(() => 'resolved', failure);
            out.keepalive = await within(request, 5000);
            out.retried = await within(third.then(() => attempts), 10000);
            k.close();
            return out;
        """,
            f"ws://127.0.0.1:{port}/gotalk/",
            timeout=30,
        )
    finally:
        server.close()
        for writer in held:
            writer.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
    address = f"ws://127.0.0.1:{port}/gotalk/"
    expected = [f"gotalk: cannot connect: no answer from {address} within 500 ms", True, None]
    assert result["open"] != "not settled", "the open callback was not called"
    elapsed, err = result["open"]
    assert 450 <= elapsed <= 1500, elapsed
    assert err == expected
    assert result["queued"] == expected
    assert result["keepalive"] == expected
    assert result["retried"] == 3  # the open() attempt, then keep-alive's first and a retry
    assert len(accepted) >= 3


async def test_a_server_that_never_sends_its_version(tmp_path: Path) -> None:
    """Upgraded, but no "01": after connectTimeout the client sends f00000003 and closes."""
    seen: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        seen.append(await recv())  # the client's "01"; ours never comes
        await record_until_closed(ws, seen)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            FAILURE
            + """
            const s = gotalk.Sock();
            s.connectTimeout = 500;
            await new Promise((resolve, reject) =>
              s.open(ADDR, (err) => (err ? reject(err) : resolve())));
            const closed = new Promise((resolve) => s.once('close', resolve));
            const pending = s.request('echo', 1).then(() => 'resolved', failure);
            return [await within(pending, 5000), await within(closed.then(failure), 1000)];
        """,
            address,
        )
    scripted.check()
    timeout = [f"gotalk protocol error: no answer from {address} within 500 ms", True, 3]
    assert result == [timeout, timeout]
    assert seen == [b"01", b"r0000004echo00000001", "1", b"f00000003", 4003]


async def test_a_server_silent_after_its_heartbeat_is_closed(tmp_path: Path) -> None:
    """`01` and one heartbeat, then nothing: with a 100 ms heartbeat interval the pending
    request rejects and close is emitted with a timeout error, well within 2 s."""
    seen: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        await ws.send(b"h0000%08x" % int(time.time()))
        seen.extend([await recv(), await recv(), await recv()])  # 01, the request
        await record_until_closed(ws, seen)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            FAILURE
            + """
            const s = gotalk.Sock();
            s.heartbeatInterval = 100;
            await new Promise((resolve, reject) =>
              s.open(ADDR, (err) => (err ? reject(err) : resolve())));
            const t0 = Date.now();
            const closed = new Promise((resolve) => s.once('close', resolve));
            const pending = s.request('echo', 1).then(() => 'resolved', failure);
            const out = [await within(pending, 5000), await within(closed.then(failure), 1000)];
            return [out, Date.now() - t0, s.isOpen];
        """,
            address,
        )
    scripted.check()
    (request, close), elapsed, is_open = result
    assert request != "not settled", "the request never settled"
    assert request[0].startswith("gotalk protocol error: timeout: nothing from the server for ")
    assert request[1:] == [True, 3]
    assert close == request
    assert elapsed < 2000 and not is_open
    assert seen == [b"01", b"r0000004echo00000001", "1", b"f00000003", 4003]


async def test_a_server_with_slow_heartbeats_is_not_cut(tmp_path: Path) -> None:
    """Heartbeats every 0.4 s against our 0.1 s interval: the silence limit follows the
    server's gaps (3 x 0.4 s), so a request answered after 2 s still succeeds."""

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        header, payload = await recv(), await recv()
        for _ in range(5):
            await asyncio.sleep(0.4)  # the server's heartbeat interval, not synchronisation
            await ws.send(b"h0000%08x" % int(time.time()))
        await ws.send(b"R" + header[1:5] + b"%08x" % len(payload))
        await ws.send(payload)
        await ws.wait_closed()

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            FAILURE
            + """
            const s = gotalk.Sock();
            s.heartbeatInterval = 100;
            let beats = 0;
            s.on('heartbeat', () => beats++);
            await new Promise((resolve, reject) =>
              s.open(ADDR, (err) => (err ? reject(err) : resolve())));
            const out = await within(s.request('echo', 'late').catch(failure), 5000);
            const open = s.isOpen;
            s.close();
            return [out, beats, open];
        """,
            address,
        )
    scripted.check()
    assert result == ["late", 5, True]


async def test_request_timeout_and_no_cut_without_heartbeats(tmp_path: Path) -> None:
    """A server that sends `01` and never answers nor heartbeats (as a Go server may): the
    liveness check stays off, so the socket stays open; `requestTimeout` rejects the request."""
    requests: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        requests.extend([await recv(), await recv()])
        await ws.wait_closed()

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            FAILURE
            + """
            const s = gotalk.Sock();
            s.heartbeatInterval = 100;
            s.requestTimeout = 600;  // six heartbeat ticks, twice the silence limit
            await new Promise((resolve, reject) =>
              s.open(ADDR, (err) => (err ? reject(err) : resolve())));
            const t0 = Date.now();
            const out = await within(s.request('echo', 1).then(() => 'resolved', failure), 5000);
            const elapsed = Date.now() - t0;
            const open = s.isOpen;
            s.close();
            return [out, elapsed, open];
        """,
            address,
        )
    scripted.check()
    out, elapsed, is_open = result
    assert out == ["gotalk: no result for echo within 600 ms", True, None]
    assert 550 <= elapsed < 2000 and is_open
    assert requests == [b"r0000004echo00000001", "1"]

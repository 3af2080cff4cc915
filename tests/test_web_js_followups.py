"""Follow-ups to a hunt of our browser library (transports/web/*.js, joined as gotalk.js), run
in Node 20+ against real peerwire servers and scripted ``websockets`` servers: a request
refused by a server draining for a graceful close, the stream requests from the server the
page refused, and a payload split into many tiny frames.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

import rpc
from rpc.errors import CLOSING
from tests.rpc_helpers import wait_until
from tests.test_web_js_node import Scripted, run_node
from transports.websocket import HttpOptions


# within(promise, ms): the promise's value, or 'not settled' once ms have passed
async def frames_until_closed(recv: Any) -> list[Any]:
    """The client's frames (heartbeats skipped) until it closes: then its close code, or
    "open" when it sent nothing for 5 s (``recv``'s bound) and did not close."""
    seen: list[Any] = []
    while True:
        try:
            seen.append(await recv())
        except ConnectionClosed as closed:
            seen.append(closed.rcvd.code if closed.rcvd else None)
            return seen
        except TimeoutError:
            seen.append("open")
            return seen


# --- a request refused by a server draining for a graceful close ----------------------------


async def test_a_request_refused_by_a_draining_server_fails_at_its_close(tmp_path: Path) -> None:
    """A peerwire server closing gracefully answers a request that comes during its drain
    with a retry result, CLOSING (not run). The request is not sent again on that
    connection: it rejects with ``err.retry`` once the server has closed it, after the
    result of the call the drain waited for. Before, the client waited the retry result's
    0.5 s to send it again; the connection closed meanwhile and the request failed with
    "socket is closed", without ``err.retry``: page code could not tell it was not run."""
    runs: list[Any] = []
    closing: list[asyncio.Future[None]] = []
    release = asyncio.Event()
    registry = rpc.Registry()

    @registry.handle("hold")
    async def hold(_: Any = None) -> str:
        await release.wait()
        return "held"

    @registry.handle("drain")
    async def drain(_: Any = None) -> str:
        peer = rpc.current_peer.get()
        closing.append(asyncio.ensure_future(peer.close(drain_timeout=30)))
        await wait_until(lambda: peer.gave_up is not None)  # draining now
        return "draining"

    @registry.handle("count")
    def count(value: Any) -> Any:
        runs.append(value)
        return value

    @registry.handle_notification("release")
    def on_release(_: Any = None) -> None:
        release.set()

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        try:
            result = await run_node(
                tmp_path,
                """
                const s = await connect(ADDR);
                const events = [];
                s.on('close', () => events.push('close'));
                s.on('retry', () => events.push('retry'));
                const hold = s.request('hold').then((v) => { events.push(v); return v; });
                const draining = await within(s.request('drain'), 5000);
                const late = s.request('count', 1).then(() => 'resolved', (e) => {
                  events.push('late');
                  return [e.message, e.retry === true, e.wait];
                });
                s.notify('release', null);  // read after 'count': hold ends, the drain too
                return { draining: draining, late: await within(late, 10000),
                         hold: await within(hold, 5000), events: events };
            """,
                server.url.websocket_uri,
            )
        finally:
            release.set()
            await asyncio.wait_for(asyncio.gather(*closing), 10)
    assert result == {
        "draining": "draining",
        "late": [CLOSING, True, 500],
        "hold": "held",
        "events": ["held", "close", "late"],  # no retry; rejected at the close
    }
    assert runs == []


async def test_a_refused_request_is_not_sent_again_and_fails_at_its_timeout(
    tmp_path: Path,
) -> None:
    """A server that refuses with CLOSING and does not close: the request is sent once and
    rejects with ``err.retry`` at ``requestTimeout``; the connection stays open. Before, it
    was sent again every 20 ms (the retry result's wait), 6 times in all, and rejected after
    the 5th retry, long before its timeout."""
    seen: dict[str, Any] = {}

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        header = await recv()
        seen["request"] = [header, await recv()]
        message = CLOSING.encode()
        await ws.send(b"e" + header[1:5] + b"00000014" + b"%08x" % len(message))
        await ws.send(message)
        seen["after"] = await frames_until_closed(recv)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            const s = await connect(ADDR);
            s.requestTimeout = 700;
            const t0 = Date.now();
            const late = s.request('count', 1).then(() => 'resolved',
              (e) => [e.message, e.retry === true, e.wait, Date.now() - t0]);
            const out = await within(late, 5000);
            const open = s.isOpen;
            s.close();
            return [out, open];
        """,
            address,
        )
    scripted.check()
    assert seen["request"] == [b"r0000005count00000001", "1"]
    (message, retry, wait, elapsed), still_open = result
    assert [message, retry, wait, still_open] == [CLOSING, True, 20, True]
    assert 650 <= elapsed < 3000, elapsed
    assert seen["after"] == [1000]  # nothing sent again: the client's close came next


# --- stream requests from the server that the page refused -----------------------------------


async def test_refused_stream_requests_are_remembered_up_to_a_bound(tmp_path: Path) -> None:
    """A server opens 257 stream requests and ends none: each is refused; a part of the
    last is still dropped (the connection answers a request after it), but the first is
    forgotten: its part is one of an unknown stream, answered with f00000002 and a close.
    Before, every refused stream was kept until the connection closed (a hostile server
    grew the set without bound) and the first one's part was dropped too."""
    seen: dict[str, Any] = {}

    def stream_request(number: int) -> bytes:
        return b"s%04x001x00000001" % number

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        for number in range(257):
            await ws.send(stream_request(number))
            await ws.send(b"a")
        seen["refusals"] = {(await recv(), await recv()) for _ in range(257)}
        await ws.send(b"p%04x00000001" % 256)  # the last refused: dropped
        await ws.send(b"b")
        await ws.send(b"r\x00\x00\x00\x01004ping00000000")
        seen["ping"] = [await recv(), await recv()]
        await ws.send(b"p%04x00000001" % 0)  # the first, forgotten: an unknown stream
        await ws.send(b"b")
        await ws.send(b"r\x00\x00\x00\x02004ping00000000")
        seen["after"] = await frames_until_closed(recv)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            gotalk.handle('ping', () => 'pong');
            const s = await connect(ADDR);
            const closed = new Promise((resolve) => s.on('close', (err) => resolve(err)));
            const err = await within(closed, 10000);
            return err && err.message ? [err.message, err.code] : err;
        """,
            address,
        )
    scripted.check()
    message = "stream requests not supported"
    assert seen["refusals"] == {
        (b"E%04x00000%03x" % (number, len(message)), message) for number in range(257)
    }
    assert seen["ping"] == [b"R\x00\x00\x00\x0100000006", '"pong"']
    assert seen["after"] == [b"f00000002", 4002]
    assert result == ["gotalk protocol error: stream part for an unknown stream", 2]


# --- a payload split into many tiny frames ---------------------------------------------------

TINY_FRAMES = 200_000


async def test_a_payload_in_one_byte_frames_is_read_in_linear_time(tmp_path: Path) -> None:
    """A result of 200,000 bytes, each in a WebSocket frame of its own, then one of 5,007
    bytes whose first 7 come in 1-byte frames and the rest in one frame: both arrive whole
    and in order, the first within 15 s (about 2 s here; the bound is wide for loaded
    machines). Before, each frame was a chunk of its own (some 500 bytes each) and taking
    the payload shifted them out one by one, each shift moving the rest: 36 s here."""
    size = TINY_FRAMES
    payload = bytes(i % 251 for i in range(size))
    mixed = bytes(range(7)) + b"x" * 5000  # 1-byte frames, then one large one, kept as is

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        for body in (payload, mixed):
            header = await asyncio.wait_for(ws.recv(), 60)  # slow before: not the check
            while header[:1] == b"h":  # a heartbeat
                header = await asyncio.wait_for(ws.recv(), 60)
            assert header[:1] == b"r", header
            await ws.send(b"R" + header[1:5] + b"%08x" % len(body))
            # the body's frames written as they are on the wire: FIN + binary, unmasked
            first = 7 if body is mixed else len(body)
            frames = [b"\x82\x01" + body[i : i + 1] for i in range(first)]
            rest = body[first:]
            if rest:
                frames.append(b"\x82\x7e" + len(rest).to_bytes(2, "big") + rest)
            ws.transport.write(b"".join(frames))
        await frames_until_closed(recv)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            const digest = (b) => {
              let h = 0;
              for (let i = 0; i < b.length; i++) h = (h * 31 + b[i]) >>> 0;
              return [b.length, h];
            };
            const s = await connect(ADDR);
            const t0 = Date.now();
            const big = await within(s.bufferRequest('big', null).then(digest), 60000);
            const elapsed = Date.now() - t0;
            const mixed = await within(s.bufferRequest('mixed', null).then(digest), 5000);
            s.close();
            return [big, elapsed, mixed];
        """,
            address,
            timeout=90,
        )
    scripted.check()

    def digest(data: bytes) -> list[int]:
        h = 0
        for byte in data:
            h = (h * 31 + byte) % 2**32
        return [len(data), h]

    big, elapsed, mixed_digest = result
    assert big == digest(payload)
    assert mixed_digest == digest(mixed)
    assert elapsed < 15000, f"{size} one-byte frames took {elapsed} ms"

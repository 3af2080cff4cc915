"""Stream requests of our browser library (transports/web/*.js, joined as gotalk.js, run in
Node 20+) refused by a server draining for a graceful close (CLOSING, not run): they fail as
single requests do, once the connection closes or at ``requestTimeout``, with the same kind
of error (``err.retry``, ``err.wait``), and send nothing more meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection

import rpc
from rpc.errors import CLOSING
from tests.rpc_helpers import wait_until
from tests.test_web_js_followups import frames_until_closed
from tests.test_web_js_node import Scripted, run_node
from transports.websocket import HttpOptions

# an error's kind, as the page sees it: a plain Error, its message, retry, wait, own keys
SHAPE = """
const shape = (e) => [Object.getPrototypeOf(e) === Error.prototype, e.message,
                      e.retry === true, e.wait, Object.keys(e).sort()];
"""


async def test_a_stream_refused_by_a_draining_server_fails_at_its_close(tmp_path: Path) -> None:
    """During a peerwire server's drain, a stream request and a request are both refused
    with CLOSING. The stream fails (``error``) once the server has closed the connection,
    after the result of the call the drain waited for, with an error of the same kind as
    the request's (a plain Error: message CLOSING, ``retry``, ``wait``). Before, the stream
    failed as soon as the retry result came, while the connection was still open."""
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

    @registry.handle_stream("stream")
    async def stream(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for part in parts:
            runs.append(part)
            yield part

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
                SHAPE
                + """
                const s = await connect(ADDR);
                const events = [];
                s.on('close', () => events.push('close'));
                s.on('retry', () => events.push('retry'));
                const hold = s.request('hold').then((v) => { events.push(v); return v; });
                const draining = await within(s.request('drain'), 5000);
                const st = s.streamRequest('stream');
                const streamed = new Promise((resolve) => {
                  st.on('data', () => events.push('data'));
                  st.on('end', () => resolve('ended'));
                  st.on('error', (e) => { events.push(['stream', s.isOpen]); resolve(shape(e)); });
                });
                st.write('a');
                const single = s.request('count', 1).then(() => 'resolved', (e) => {
                  events.push('single');
                  return shape(e);
                });
                s.notify('release', null);  // read after both: hold ends, the drain too
                return { draining: draining, stream: await within(streamed, 10000),
                         single: await within(single, 10000), hold: await within(hold, 5000),
                         events: events };
            """,
                server.url.websocket_uri,
            )
        finally:
            release.set()
            await asyncio.wait_for(asyncio.gather(*closing), 10)
    refused = [True, CLOSING, True, 500, ["retry", "wait"]]
    assert result == {
        "draining": "draining",
        "stream": refused,
        "single": refused,  # the same kind of error
        "hold": "held",
        # failed at the close (the connection no longer open), after hold's result
        "events": ["held", ["stream", False], "close", "single"],
    }
    assert runs == []


async def test_a_refused_stream_sends_nothing_more_and_fails_at_its_timeout(
    tmp_path: Path,
) -> None:
    """A server that refuses a stream request with CLOSING and does not close: parts the
    page writes after the refusal (and its end) are not sent, and the stream fails with
    ``err.retry`` at ``requestTimeout`` from its first part; the connection stays open.
    Before, it failed as soon as the retry result came."""
    seen: dict[str, Any] = {}

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        header = await recv()
        seen["request"] = [header, await recv()]
        message = CLOSING.encode()
        await ws.send(b"e" + header[1:5] + b"00000014" + b"%08x" % len(message))
        await ws.send(message)
        await ws.send(b"n007refused00000000")  # read after the retry result: the page writes
        seen["after"] = await frames_until_closed(recv)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            SHAPE
            + """
            const s = await connect(ADDR);
            s.requestTimeout = 700;
            const t0 = Date.now();
            const st = s.streamRequest('stream');
            let written = false;
            gotalk.handleNotification('refused', () => {
              st.write('b');
              st.end();
              written = true;
            });
            const failed = new Promise((resolve) => {
              st.on('end', () => resolve('ended'));
              st.on('error', (e) => resolve([shape(e), Date.now() - t0]));
            });
            st.write('a');
            const out = await within(failed, 5000);
            const open = s.isOpen;
            s.close();
            return [out, written, open];
        """,
            address,
        )
    scripted.check()
    assert seen["request"] == [b"s!000006stream00000001", "a"]
    (error, elapsed), written, still_open = result
    assert error == [True, CLOSING, True, 20, ["retry", "wait"]]
    assert [written, still_open] == [True, True]
    assert 650 <= elapsed < 3000, elapsed
    assert seen["after"] == [1000]  # nothing sent after the refusal: the client's close next

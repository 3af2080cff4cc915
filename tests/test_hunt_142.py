"""Defects of our browser library (transports/web/*.js, joined as gotalk.js) found by a
hunt, run in Node 20 against real peerwire servers and scripted ``websockets`` servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

import rpc
from tests.test_web_js_node import Scripted, run_node
from transports.websocket import HttpOptions

CIRCULAR = """
const circular = {};
circular.self = circular;
"""


async def _page_answers(tmp_path: Path, ops: tuple[str, ...], handlers: str) -> list[Any]:
    """The server calls each of ``ops`` on a Node page whose ``handlers`` (JS) are
    registered; what each answered (["error", text], or ["no answer", op] after 3 s), as
    both sides saw it."""
    answers: list[Any] = []
    registry = rpc.Registry()

    @registry.handle("ask")
    async def ask(_: Any = None) -> list[Any]:
        client = rpc.current_peer.get()
        out = []
        for op in ops:
            try:
                out.append(await asyncio.wait_for(client.request(op, None), 3))
            except rpc.RemoteError as exc:
                out.append(["error", str(exc)])
            except TimeoutError:
                out.append(["no answer", op])
        answers.extend(out)
        return out

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        result = await run_node(
            tmp_path,
            CIRCULAR
            + handlers
            + """
            const s = await connect(ADDR);
            const out = await within(s.request('ask'), 15000);
            s.close();
            return out;
        """,
            server.url.websocket_uri,
        )
    assert result == answers
    return answers


async def test_page_handler_failing_with_a_value_without_json_form(tmp_path: Path) -> None:
    """A page handler that throws, rejects or calls ``result.error`` with a value that has no
    JSON text (a BigInt, a circular object) still answers the server with an error result.
    Before, building the error's text threw: the server's request was never answered (it
    waited for its own timeout) and Node died of the unhandled rejection."""
    answers = await _page_answers(
        tmp_path,
        ("throws", "rejects", "errors"),
        """
        gotalk.handle('throws', () => { throw 10n; });
        gotalk.handle('rejects', () => Promise.reject(circular));
        gotalk.handle('errors', (p, result) => result.error(circular));
        """,
    )
    assert [answer[0] for answer in answers] == ["error", "error", "error"], answers
    assert answers[0][1] == "10"


async def test_decoded_text_keeps_a_leading_byte_order_mark(tmp_path: Path) -> None:
    """U+FEFF at the start of received text is kept: ``gotalk.utf8.decode`` of echoed
    bytes, an operation the server calls and an error result. Before, the library's
    TextDecoder dropped it (its default): the page got other text than was sent."""
    registry = rpc.Registry()

    @registry.handle("ask")
    async def ask(_: Any = None) -> Any:
        client = rpc.current_peer.get()
        return await client.request("\ufeffop", None)

    @registry.handle("fail")
    def fail(_: Any = None) -> Any:
        raise rpc.RemoteError("\ufeffbad")

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        result = await run_node(
            tmp_path,
            """
            gotalk.handle('op', () => 'without');
            gotalk.handle('\\ufeffop', () => 'with');
            const s = await connect(ADDR);
            const out = {};
            out.decoded = gotalk.utf8.decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41]));
            out.op = await s.request('ask');
            out.error = await s.request('fail').then(() => 'resolved', (e) => e.message);
            s.close();
            return out;
        """,
            server.url.websocket_uri,
        )
    assert result == {"decoded": "\ufeffA", "op": "with", "error": "\ufeffbad"}


async def test_a_retry_wait_past_the_timer_range(tmp_path: Path) -> None:
    """A retry result asking for a wait timers cannot hold (over 2**31 - 1 ms, up to the
    field's 0xffffffff) rejects the request at once with ``err.retry``. Before, the timer
    overflowed to 1 ms: the request went again at once, each time, until maxRetries."""
    requests: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        while True:
            try:
                header = await recv()
            except ConnectionClosed:
                return
            requests.append([header, await recv()])
            await ws.send(b"e" + header[1:5] + b"ffffffff00000004")
            await ws.send(b"busy")

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            CIRCULAR
            + """
            const s = await connect(ADDR);
            const out = await within(s.request('echo', 1).then(
              () => 'resolved', (e) => [e.message, e.retry === true, e.wait]), 5000);
            s.close();
            return out;
        """,
            address,
        )
    scripted.check()
    assert result == ["busy", True, 0xFFFFFFFF]
    assert requests == [[b"r0000004echo00000001", "1"]]


async def test_a_request_answered_with_a_streamed_result(tmp_path: Path) -> None:
    """``request``/``bufferRequest`` of an operation that answers with a streamed result (a
    peerwire handler that is an async generator) rejects, naming it, as the Python client
    raises ``PayloadError``. Before, the promise resolved with the first part alone and the
    other parts were dropped: the page took a part for the whole result."""
    registry = rpc.Registry()

    @registry.handle("parts")
    async def parts(_: Any = None) -> AsyncIterator[int]:
        yield 1
        yield 2

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry,
        web=HttpOptions(allow_missing_origin=True),
    ) as server:
        result = await run_node(
            tmp_path,
            """
            const s = await connect(ADDR);
            const failed = (e) => ['rejected', e.message];
            const out = {};
            out.json = await s.request('parts').then((v) => ['resolved', v], failed);
            out.raw = await s.bufferRequest('parts').then(
              (v) => ['resolved', gotalk.utf8.decode(v)], failed);
            out.after = await s.request('echo', 'after');
            s.close();
            return out;
        """,
            server.url.websocket_uri,
        )
    expected = ["rejected", "gotalk: parts answered with a streamed result, not one result"]
    assert result == {"json": expected, "raw": expected, "after": "after"}


async def test_settings_past_the_timer_range(tmp_path: Path) -> None:
    """``connectTimeout``, ``heartbeatInterval`` and ``requestTimeout`` over 2**31 - 1 ms
    (timers fire at once past that) act as that longest delay, about 24.8 days. Before, the
    timers overflowed to 1 ms: the connect attempt failed at once, a heartbeat went every
    millisecond, and a request slower than 1 ms (here 200 ms) was rejected as timed out."""
    seen: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        header, payload = await recv(), await recv()
        seen.append([header, payload])
        await asyncio.sleep(0.2)  # a slow operation: the request timeout's subject
        await ws.send(b"R" + header[1:5] + b"%08x" % len(payload))
        await ws.send(payload)
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()  # until the client closes (heartbeats kept by Scripted)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            const s = gotalk.Sock();
            s.connectTimeout = s.heartbeatInterval = s.requestTimeout = 2 ** 32;
            const out = {};
            out.open = await new Promise((resolve) =>
              s.open(ADDR, (err) => resolve(err ? err.message : 'open')));
            out.slow = await s.request('slow', 'done').catch((e) => e.message);
            s.close();
            return out;
        """,
            address,
        )
    scripted.check()
    assert result == {"open": "open", "slow": "done"}
    assert seen == [[b"r0000004slow00000006", '"done"']]
    assert scripted.heartbeats == []


async def test_page_handler_error_whose_message_has_no_string_form_is_answered(
    tmp_path: Path,
) -> None:
    """An Error whose ``message`` has no string form (a null-prototype object put there):
    errorText returned it as it was and ``_sendError``'s ``String(message)`` threw, so the
    server's request was never answered and Node died of the unhandled rejection (of the
    TypeError in the read, for a synchronous throw). Helper-145's review of fb82c72."""
    answers = await _page_answers(
        tmp_path,
        ("throws", "rejects"),
        """
        const odd = () => Object.assign(new Error('x'), { message: Object.create(null) });
        gotalk.handle('throws', () => { throw odd(); });
        gotalk.handle('rejects', () => Promise.reject(odd()));
        """,
    )
    assert [answer[0] for answer in answers] == ["error", "error"], answers

"""Request values our browser library (transports/web/gotalk.js) cannot send, and the old
two-argument ``sock.request(op, callback)`` of gotalk.js pages, in Node.

A value without JSON form (a Symbol, a toJSON returning undefined, a BigInt, a circular
object) rejects the request's promise: nothing thrown synchronously, nothing sent, nothing
left pending, so ``end()`` still closes. Before, ``request(op, cb)`` rejected with a
TypeError, never called ``cb`` and left a pending entry that kept ``end()`` from closing;
BigInt and circular values threw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from tests.test_web_js_node import Scripted, run_node

# settled(p): 'resolved: <value>', the rejection's class name, or 'threw: <class>' when the
# call threw instead of returning a promise
SETTLED = """
const settled = async (call) => {
  let p;
  try {
    p = call();
  } catch (e) {
    return 'threw: ' + e.constructor.name;
  }
  return p.then((v) => 'resolved: ' + JSON.stringify(v), (e) => e.constructor.name);
};
const ended = (s) => {
  const closed = new Promise((resolve) => s.once('close', resolve));
  s.end();
  return Promise.race([closed.then(() => 'closed'), sleep(3000).then(() => 'still open')]);
};
const circular = {};
circular.self = circular;
"""


class Echo(Scripted):
    """Answers every request with its payload and keeps the frames it got; ``ask`` is sent
    to the client as a request of ours after its first request."""

    def __init__(self, ask: bytes | None = None) -> None:
        super().__init__(self.echo)
        self.ask = ask
        self.seen: list[list[Any]] = []

    async def echo(self, ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        while True:
            try:
                header = await recv()
            except ConnectionClosed:
                return
            assert isinstance(header, bytes)
            payload = await recv() if header[-8:] != b"00000000" else ""
            self.seen.append([header, payload])
            if header[:1] == b"E":  # the client's answer to our request
                continue
            data = payload.encode() if isinstance(payload, str) else payload
            await ws.send(b"R" + header[1:5] + b"%08x" % len(data))
            await ws.send(data)
            if self.ask:
                await ws.send(self.ask)
                self.ask = None


async def run_on(echo: Echo, tmp_path: Path, script: str) -> Any:
    """Run ``script`` (after SETTLED's helpers) in Node against ``echo``; what it returns.
    The server's own checks must hold."""
    async with echo as address:
        result = await run_node(tmp_path, SETTLED + script, address)
    echo.check()
    return result


async def test_old_two_argument_request_form(tmp_path: Path) -> None:
    """``s.request('echo', cb)`` sends null and calls ``cb(null, result)``; ``end()`` closes."""
    echo = Echo()
    result = await run_on(
        echo,
        tmp_path,
        """
            const s = await connect(ADDR);
            const out = await new Promise((resolve) => {
              const p = s.request('echo', (err, value) => resolve([err, value, typeof p.then]));
            });
            out.push(await new Promise((resolve) =>
              s.bufferRequest('echo', (err, value) => resolve([err, value.length]))));
            out.push(await ended(s));
            return out;
        """,
    )
    assert result == [None, None, "function", [None, 0], "closed"]
    assert echo.seen == [[b"r0000004echo00000004", "null"], [b"r0001004echo00000000", ""]]


async def test_a_value_without_json_rejects_and_end_closes(tmp_path: Path) -> None:
    """A Symbol, a toJSON returning undefined, a BigInt: TypeError rejections, nothing sent
    (not even a request id used), nothing pending: ``end()`` closes at once."""
    echo = Echo()
    result = await run_on(
        echo,
        tmp_path,
        """
            const s = await connect(ADDR);
            const out = [];
            for (const value of [Symbol('x'), {toJSON: () => undefined}, 10n]) {
              out.push(await settled(() => s.request('x', value)));
            }
            out.push(await settled(() => s.request('echo', 'after')));
            out.push(await ended(s));
            return out;
        """,
    )
    assert result == ["TypeError", "TypeError", "TypeError", 'resolved: "after"', "closed"]
    assert echo.seen == [[b"r0000004echo00000007", '"after"']]


async def test_a_circular_value_rejects(tmp_path: Path) -> None:
    """``request`` and ``bufferRequest`` with a circular object reject; they threw before."""
    echo = Echo()
    result = await run_on(
        echo,
        tmp_path,
        """
            const s = await connect(ADDR);
            const out = [await settled(() => s.request('x', circular)),
                         await settled(() => s.bufferRequest('x', circular))];
            out.push(await ended(s));
            return out;
        """,
    )
    assert result == ["TypeError", "TypeError", "closed"]
    assert echo.seen == []


async def test_a_handler_result_without_json_is_an_error_result(tmp_path: Path) -> None:
    """A page handler returning a circular object answers the server with ``E``; before,
    the exception escaped the WebSocket's message handler and the request was never
    answered."""
    echo = Echo(ask=b"r\x01\x02\x03\x04006circle00000000")
    result = await run_on(
        echo,
        tmp_path,
        """
            gotalk.handle('circle', () => circular);
            const s = await connect(ADDR);
            const out = [await settled(() => s.request('echo', 1))];
            out.push(await settled(() => s.request('echo', 2)));
            out.push(await ended(s));
            return out;
        """,
    )
    assert result == ["resolved: 1", "resolved: 2", "closed"]
    answers = [frames for frames in echo.seen if frames[0][:1] == b"E"]
    assert len(answers) == 1 and answers[0][0][:5] == b"E\x01\x02\x03\x04", echo.seen
    assert answers[0][1].startswith("cannot send the result: "), echo.seen


async def test_a_stream_request_that_cannot_start_leaves_nothing_pending(tmp_path: Path) -> None:
    """An operation name over 4095 bytes: the first ``write`` throws, and ``end()`` of the
    socket still closes (the stream used to stay pending for good)."""
    echo = Echo()
    result = await run_on(
        echo,
        tmp_path,
        """
            const s = await connect(ADDR);
            const st = s.streamRequest('x'.repeat(4096));
            let thrown;
            try {
              st.write('a');
            } catch (e) {
              thrown = e.message;
            }
            return [thrown, await ended(s)];
        """,
    )
    assert result == ["gotalk: name too long: " + "x" * 4096, "closed"]
    assert echo.seen == []

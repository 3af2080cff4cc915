"""Our browser library and the web chat demo in a real headless Chromium (Debian's).

One browser serves the whole module (each test opens its own context). Servers are real
peerwire ``ws+gotalk`` servers on 127.0.0.1: the demo as users start it (a subprocess) and
in-process servers where a test needs to reach into the server (restart, retries).
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, expect

import rpc
from tests.browser import (
    assert_not_blank,
    browser_context,
    browser_fixture,
    eventually,
    page_errors,
)
from tests.rpc_helpers import gotalk_peer_registry
from transports.websocket import HttpOptions

ROOT = Path(__file__).resolve().parent.parent
WEBCHAT = ROOT / "examples" / "webchat" / "server.py"

__all__ = ["browser_fixture"]  # the module's Chromium, a fixture used here
pytestmark = pytest.mark.asyncio(loop_scope="module")


def load_webchat() -> Any:
    spec = importlib.util.spec_from_file_location("webchat_server", WEBCHAT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


webchat = load_webchat()

# A bare page for the library's API: handlers the server may call, one kept-alive socket.
TEST_PAGE = """<!doctype html>
<meta charset="utf-8"><title>gotalk.js in a browser</title><link rel="icon" href="data:,">
<script src="/gotalk/gotalk.js"></script>
<script>
window.notes = []; window.heartbeats = 0; window.retries = [];
gotalk.handle('whoami', function (params, result) {   // gotalk.js style: answer via result()
  result({name: 'chromium', got: params});
});
gotalk.handle('double', async (n) => n * 2);          // or return a value / a Promise
gotalk.handle('boom', () => { throw new Error('failed in the browser'); });
gotalk.handleBufferRequest('upper', (buf) => gotalk.utf8.decode(buf).toUpperCase());
gotalk.handleNotification('note', (value) => notes.push(value));
window.sock = gotalk.connection();
sock.heartbeatInterval = 200;
sock.on('heartbeat', () => heartbeats++).on('retry', (r) => retries.push(r));
window.opened = new Promise((resolve) => sock.once('open', () => resolve(true)));
</script>
<h1>gotalk.js test page</h1>
"""


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    async with browser_context(browser, 8000) as context:
        yield context


@pytest.fixture
def test_page(tmp_path: Path) -> HttpOptions:
    (tmp_path / "index.html").write_text(TEST_PAGE)
    return HttpOptions(static_dir=tmp_path)


def library_registry(logged: list[Any]) -> rpc.Registry:
    registry = gotalk_peer_registry()  # echo, greet, fail, notifyme, sleep, stream

    @registry.handle_stream("stream")
    async def stream(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for part in parts:
            yield part.upper()

    @registry.handle("ask")
    async def ask(_: Any = None) -> list[Any]:
        """A server -> browser request made while handling the browser's request."""
        browser_peer = rpc.current_peer.get()
        return [
            await browser_peer.request("whoami", "asked"),
            await browser_peer.request("double", 21),
        ]

    @registry.handle_notification("log")
    def log(value: Any) -> None:
        logged.append(value)

    return registry


# --- the demo ------------------------------------------------------------------------------


async def start_webchat() -> tuple[asyncio.subprocess.Process, str]:
    """examples/webchat/server.py as users start it; returns (process, the printed URL)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WEBCHAT),
        "--listen",
        "127.0.0.1:0",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 15)).decode().strip()
    match = re.fullmatch(r"open (http://127\.0\.0\.1:\d+/)", line)
    if match is None:
        proc.kill()
        raise AssertionError(f"the demo printed {line!r} instead of its URL")
    return proc, match.group(1)


async def read_until(proc: asyncio.subprocess.Process, text: str, seen: list[str]) -> None:
    assert proc.stdout is not None
    while not any(text in line for line in seen):
        line = await asyncio.wait_for(proc.stdout.readline(), 5)
        if not line:
            raise AssertionError(f"the demo exited before printing {text!r}: {seen}")
        seen.append(line.decode().strip())


async def test_webchat_tabs_chat_through_the_server(context: BrowserContext) -> None:
    proc, url = await start_webchat()
    try:
        alice, bob = await context.new_page(), await context.new_page()
        # one list per tab, filled later by its `pageerror` listener: keep the lists themselves
        tab_errors = [page_errors(alice), page_errors(bob)]
        await alice.goto(url + "?name=alice")
        await bob.goto(url + "?name=bob")
        # the server asked each tab for its name (server -> browser request) and shows it
        printed: list[str] = []
        await read_until(proc, "alice joined", printed)
        await read_until(proc, "bob joined", printed)
        for page in (alice, bob):
            await expect(page.locator("#status")).to_have_text("online")
            await expect(page.locator("#users li")).to_have_text(["alice", "bob"])
        # the page calls `send`; the server's `message` notification reaches every tab
        await alice.fill("#text", "hello bob")
        await alice.click("#compose button")
        for page in (alice, bob):
            await expect(page.locator("#messages li").last).to_contain_text("alicehello bob")
        await bob.fill("#text", "hi alice, ünïcödé ✓")
        await bob.press("#text", "Enter")
        await expect(alice.locator("#messages li").last).to_contain_text("hi alice, ünïcödé ✓")
        # the server refuses an empty message with an error result the page shows
        assert "1 to 500 characters" in await bob.evaluate(
            "sock.request('send', '   ').catch((e) => e.message)"
        )
        # a tab opened later gets the history through the `history` op
        carol = await context.new_page()
        tab_errors.append(page_errors(carol))
        await carol.goto(url + "?name=carol")
        await expect(carol.locator("#messages li")).to_have_count(2)
        await expect(carol.locator("#messages li").first).to_contain_text("hello bob")
        await expect(alice.locator("#users li")).to_have_text(["alice", "bob", "carol"])
        await carol.close()
        await expect(alice.locator("#users li")).to_have_text(["alice", "bob"])
        assert_not_blank(await bob.screenshot())
        assert tab_errors == [[], [], []]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0


# --- the library's API in the browser ----------------------------------------------------


async def test_library_requests_notifications_streams_and_server_requests(
    context: BrowserContext, test_page: HttpOptions
) -> None:
    logged: list[Any] = []
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=library_registry(logged),
        web=test_page,
        heartbeat_interval=0.2,
    ) as server:
        port = server.url.port
        page = await context.new_page()
        errors = page_errors(page)
        await page.goto(f"http://127.0.0.1:{port}/")
        assert await page.evaluate("opened")
        # the default address comes from the script's own URL
        assert await page.evaluate("gotalk.defaultResponderAddress") == (
            f"ws://127.0.0.1:{port}/gotalk/"
        )

        # server -> browser requests, answered by the page's handlers
        [peer] = server.peers
        assert await peer.request("whoami", {"q": 1}) == {"name": "chromium", "got": {"q": 1}}
        assert await peer.request("double", 21) == 42
        assert await peer.request("upper", b"abc", raw=True) == b"ABC"
        with pytest.raises(rpc.RemoteError, match="failed in the browser"):
            await peer.request("boom")
        with pytest.raises(rpc.RemoteError, match='unknown operation "nope"'):
            await peer.request("nope")
        with pytest.raises(rpc.RemoteError, match="stream requests not supported"):
            [x async for x in peer.stream("whoami", parts=["a", "b"])]
        # heartbeats both ways: the page sends one every 200 ms here, the server every 0.2 s
        await eventually(lambda: peer.heartbeats_received >= 2, "heartbeats from the page")

        result = await page.evaluate("""async () => {
            const out = {};
            out.greet = await sock.request('greet', {name: 'Chromium'});
            out.unicode = await sock.request('echo', 'héllo ✓ 😀 \\u0000');
            out.text = gotalk.utf8.decode(await sock.bufferRequest('echo', 'raw text'));
            out.bytes = Array.from(await sock.bufferRequest('echo', new Uint8Array([0, 1, 255])));
            out.error = await sock.request('fail').catch((e) => e.message);
            out.unknown = await sock.request('nope', 1).catch((e) => e.message);
            out.asked = await sock.request('ask');
            out.notified = await sock.request('notifyme', {x: 1});
            out.notes = notes;
            out.callback = await new Promise((resolve) =>
              sock.request('greet', {name: 'cb'}, (err, value) => resolve([err, value])));
            out.pipelined = await Promise.all(
              Array.from({length: 50}, (_, i) => sock.request('echo', i)));
            out.stream = await new Promise((resolve, reject) => {
              const parts = [];
              const stream = sock.streamRequest('stream');
              stream.on('data', (d) => parts.push(gotalk.utf8.decode(d)))
                    .on('end', () => resolve(parts)).on('error', reject);
              stream.write('part1');
              stream.write({n: 2});
              stream.end();
            });
            sock.notify('log', {line: 'from the page'});
            out.heartbeats = heartbeats;
            out.once = await new Promise((resolve, reject) => {
              gotalk.open(undefined, async (err, s) => {
                if (err) return reject(err);
                const value = await s.request('greet', {name: 'once'});
                s.close();
                resolve([value, s.isOpen]);
              });
            });
            out.closed = await new Promise((resolve) => {
              const s = gotalk.open(undefined, () => {
                const pending = s.request('greet', {name: 'x'}).then(
                  () => 'resolved', (e) => e.message);
                s.close();
                pending.then(resolve);
              });
            });
            return out;
        }""")
        assert result["greet"] == {"greeting": "Hello Chromium"}
        assert result["unicode"] == "héllo ✓ 😀 \x00"
        assert result["text"] == "raw text"
        assert result["bytes"] == [0, 1, 255]
        assert result["error"] == "something went wrong"
        assert result["unknown"] == 'unknown operation "nope"'
        assert result["asked"] == [{"name": "chromium", "got": "asked"}, 42]
        assert result["notified"] == "ok" and result["notes"] == [{"x": 1}]
        assert result["callback"] == [None, {"greeting": "Hello cb"}]
        assert result["pipelined"] == list(range(50))
        assert result["stream"] == ["PART1", '{"N":2}']
        assert result["heartbeats"] >= 1  # the server's heartbeats reach the page's listeners
        assert result["once"] == [{"greeting": "Hello once"}, False]
        assert result["closed"] == "socket is closed"  # close() rejects what is pending
        await eventually(lambda: logged == [{"line": "from the page"}], "the page's notification")
        assert errors == []


async def test_retry_results_are_honoured(context: BrowserContext, test_page: HttpOptions) -> None:
    registry = rpc.Registry()

    @registry.handle("slow")
    async def slow(_: Any = None) -> str:
        await asyncio.sleep(0.6)  # the handler's work: it holds the one slot (not a wait)
        return "slow done"

    @registry.handle("echo")
    def echo(value: Any) -> Any:
        return value

    # one request at a time: while `slow` runs, the server answers others with retry results
    options = rpc.Options(max_concurrent=1, retry_wait=0.2)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=registry, options=options, web=test_page
    ) as server:
        page = await context.new_page()
        errors = page_errors(page)
        await page.goto(f"http://127.0.0.1:{server.url.port}/")
        result = await page.evaluate("""async () => {
            await opened;
            const slow = sock.request('slow');
            const start = performance.now();
            const echoed = await sock.request('echo', 'after retries');
            const waited = performance.now() - start;
            const slowResult = await slow;
            sock.maxRetries = 0;  // give up at the first retry result instead
            const slow2 = sock.request('slow');
            const refused = await sock.request('echo', 'x').then(
              () => 'resolved', (e) => [e.message, e.retry, e.wait]);
            await slow2;
            return {echoed, waited, slowResult, refused, retries};
        }""")
        assert result["echoed"] == "after retries"
        assert result["slowResult"] == "slow done"
        assert result["waited"] >= 500  # it waited for the slot, retrying, without failing
        assert len(result["retries"]) >= 1
        assert result["retries"][0] == {
            "op": "echo",
            "wait": 200,
            "message": "request rate limit",
            "attempt": 1,
        }
        assert result["refused"] == ["request rate limit", True, 200]
        assert errors == []


async def test_keepalive_survives_a_server_restart(context: BrowserContext) -> None:
    chat = webchat.Chat()
    slow_started = asyncio.Event()

    @chat.registry.handle("slow")
    async def slow(_: Any = None) -> None:
        slow_started.set()
        await asyncio.sleep(60)  # a call still running when the server goes (not a wait)

    server = await webchat.serve("ws+gotalk://127.0.0.1:0/gotalk/", chat)
    port = server.url.port
    page = await context.new_page()
    errors = page_errors(page)
    await page.goto(f"http://127.0.0.1:{port}/?name=ada")
    await expect(page.locator("#status")).to_have_text("online")
    await eventually(lambda: list(chat.members.values()) == ["ada"], "ada joined")
    await page.evaluate(
        "window.pending = sock.request('slow').then(() => 'resolved', (e) => 'rejected: ' + "
        "e.message); window.closes = 0; sock.on('close', () => closes++)"
    )
    await asyncio.wait_for(slow_started.wait(), 5)

    await server.close(drain_timeout=0.1)  # the server goes away with a request in flight
    assert (await page.evaluate("pending")).startswith("rejected: ")
    await expect(page.locator("#status")).to_have_text("offline")
    assert await page.evaluate("closes") == 1

    chat = webchat.Chat()  # a new server process would start with an empty room
    async with webchat.serve(f"ws+gotalk://127.0.0.1:{port}/gotalk/", chat):
        await expect(page.locator("#status")).to_have_text("online")  # reconnected by itself
        await eventually(lambda: list(chat.members.values()) == ["ada"], "ada joined again")
        await page.fill("#text", "back again")
        await page.click("#compose button")
        await expect(page.locator("#messages li").last).to_contain_text("adaback again")
    assert errors == []

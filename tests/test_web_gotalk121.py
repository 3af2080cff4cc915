"""A browser client that speaks as the real gotalk.js 1.2.1 does, in headless Chromium.

``tests/gotalk121_wire.js`` behaves on the wire as gotalk.js 1.2.1 (one header per frame and
the payload in the next, base-36 ids, ``f00000002`` and close on a retry result, a
``streamRequest`` that ends only on the empty ``S``): requests, stream requests (also one
answered by a handler's single value), notifications both ways and requests past
``max_concurrent`` must all be answered, with the connection kept.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext

import rpc
from tests.browser import browser_context, browser_fixture, eventually, page_errors
from tests.rpc_helpers import gotalk_peer_registry, wait_until
from transports.websocket import HttpOptions

__all__ = ["browser_fixture"]  # the module's Chromium, a fixture used here
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]
CLIENT = Path(__file__).with_name("gotalk121_wire.js")
PAGE = """<!doctype html><meta charset="utf-8"><title>gotalk.js 1.2.1 on the wire</title>
<link rel="icon" href="data:,"><script src="/gotalk121_wire.js"></script>"""


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    async with browser_context(browser, 15000) as context:
        yield context


@pytest.fixture
def web(tmp_path: Path) -> HttpOptions:
    (tmp_path / "index.html").write_text(PAGE)
    shutil.copy(CLIENT, tmp_path / CLIENT.name)
    return HttpOptions(static_dir=tmp_path)


def registry(heard: list[Any]) -> rpc.Registry:
    reg = gotalk_peer_registry()  # echo, greet, fail, notifyme, sleep, stream

    @reg.handle("echo")  # JSON in, JSON out (gotalk.js sends JSON text)
    def echo(value: Any) -> Any:
        return value

    @reg.handle_stream("total")
    async def total(parts: AsyncIterator[int]) -> int:
        """One value for a whole stream: still answered with S parts and an empty S."""
        return sum([part async for part in parts])

    @reg.handle_notification("hello")
    def hello(value: Any) -> None:
        heard.append(value)

    return reg


async def test_gotalk121_client_is_answered_and_kept(
    context: BrowserContext, web: HttpOptions
) -> None:
    heard: list[Any] = []
    options = rpc.Options(max_concurrent=2)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry(heard),
        options=options,
        web=web,
        heartbeat_interval=0.2,
    ) as server:
        port = server.url.port
        page = await context.new_page()
        errors = page_errors(page)
        await page.goto(f"http://127.0.0.1:{port}/")
        result = await page.evaluate(
            """async (url) => {
            const sock = window.wire = new Wire121(url, 200);
            await sock.opened;
            const out = {};
            const giveUp = (p, what) => Promise.race([p, new Promise((_, reject) =>
              setTimeout(() => reject(new Error('no end of ' + what)), 5000))]);
            out.greet = await sock.request('greet', {name: 'wire'});
            out.echo = await sock.request('echo', 'héllo ✓ 😀');
            out.many = await Promise.all(
              Array.from({length: 40}, (_, i) => sock.request('echo', i)));
            out.error = await sock.request('fail', null).catch((e) => e.message);
            out.unknown = await sock.request('nope', 1).catch((e) => e.message);
            const parts = sock.streamRequest('stream');
            parts.write('a'); parts.write('b'); parts.write('c'); parts.end();
            out.stream = await giveUp(parts.done, 'stream');
            const single = sock.streamRequest('total');
            single.write(1); single.write(2); single.end();
            out.total = await giveUp(single.done, 'total');
            sock.notify('hello', {from: 'wire'});
            out.notified = await sock.request('notifyme', {x: 1});
            out.notes = sock.notifications;
            // 8 requests at once with max_concurrent=2: the server must not answer `e`
            const t0 = performance.now();
            out.slept = await Promise.all(
              Array.from({length: 8}, () => sock.request('sleep', {ms: 150})));
            out.sleptMs = performance.now() - t0;
            out.afterwards = await sock.request('echo', 'still here');
            // the server's heartbeats (every 0.2 s) reach the page: poll, up to 5 s
            const beatsBy = performance.now() + 5000;
            while (sock.log.heartbeats < 1 && performance.now() < beatsBy)
              await new Promise((resolve) => setTimeout(resolve, 10));
            out.log = sock.log;
            out.ids = sock.nextId;
            return out;
        }""",
            f"ws://127.0.0.1:{port}/gotalk/",
        )
        assert result["greet"] == {"greeting": "Hello wire"}
        assert result["echo"] == "héllo ✓ 😀"
        assert result["many"] == list(range(40))
        assert result["error"] == "something went wrong"
        assert result["unknown"] == 'unknown operation "nope"'
        assert result["stream"] == ["a", "b", "c"]
        assert result["total"] == [3]
        assert result["notified"] == "ok"
        assert result["notes"] == [["note", {"x": 1}]]
        assert result["slept"] == [{"slept": 150}] * 8
        assert result["sleptMs"] >= 4 * 150 * 0.9  # two at a time, none refused
        assert result["afterwards"] == "still here"
        log = result["log"]
        assert log["faults"] == [] and log["closed"] is None, log
        assert "e" not in log["received"]
        assert log["heartbeats"] >= 1  # the server's
        assert result["ids"] > 36  # base-36 ids past 'z' went through ('0010', ...)
        assert heard == [{"from": "wire"}]
        [peer] = server.peers  # the same connection throughout
        # the page's heartbeats (every 200 ms) on that connection
        await eventually(lambda: peer.heartbeats_received >= 2, "2 heartbeats from the page")
        assert server.peers == {peer}  # still kept, on both ends
        assert await page.evaluate("[wire.log.faults, wire.log.closed]") == [[], None]
        assert errors == []


async def test_wire_client_drops_a_server_that_sends_retry_results(
    context: BrowserContext, web: HttpOptions
) -> None:
    """The control: forced to send `e` (as a server unaware of gotalk.js would), the server
    loses the client exactly as with the real gotalk.js: `f00000002`, then close."""
    options = rpc.Options(max_concurrent=1, retry_wait=0.1)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=registry([]),
        options=options,
        web=web,
        retry_results=True,
    ) as server:
        port = server.url.port
        page = await context.new_page()
        await page.goto(f"http://127.0.0.1:{port}/")
        log = await page.evaluate(
            """async (url) => {
            const sock = new Wire121(url);
            await sock.opened;
            const calls = [sock.request('sleep', {ms: 300}), sock.request('echo', 1)];
            await Promise.allSettled(calls);
            while (!sock.log.closed) await new Promise((r) => setTimeout(r, 10));
            return sock.log;
        }""",
            f"ws://127.0.0.1:{port}/gotalk/",
        )
        assert log["faults"] == ["unexpected retry result"]
        # closed: by the page (4002) or by the server on the fault first (1000), a race
        assert log["sent"][-1] == "f" and log["closed"]["code"] in (4002, 1000)
        await wait_until(lambda: not server.peers)

"""What the browser tests of a graceful close under a page's flood share
(``tests/test_web_js_close_floods.py``, ``tests/test_web_js_close_still_serves.py``): the
page (our library, ``tests/gotalk121_wire.js``, gotalk.js 1.2.1 on the wire, and
:data:`HELPERS`, which flood and count outcomes), its fixtures ``context`` and ``web``
(import them, with ``tests.browser.browser_fixture``), the served handlers (:class:`Ran`),
the waits and the close's bounds."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page

import rpc
from tests.browser import browser_context, eventually, page_errors
from transports.websocket import HttpOptions

ROOT = Path(__file__).resolve().parent.parent
WIRE121 = Path(__file__).with_name("gotalk121_wire.js")
DRAIN = 10.0
"""The close's drain bound: far above what each close here may take (under 1 s)."""
SHORT_DRAIN = 1.5
"""The drain bound of a close held to it by a defect (the test's time)."""
PROMPT = 1.0
"""Seconds a close may take once what the page sent before it is answered."""

HELPERS = """
const FLOOD_CAP = 600;
// within(promise, ms): its value, or 'not settled' once ms have passed
window.within = (p, ms) => Promise.race(
  [p, new Promise((resolve) => setTimeout(() => resolve('not settled'), ms))]);
// flood(open, send): send(i) (a Promise) on every task turn while open() holds, up to
// FLOOD_CAP times (turns through a MessageChannel: timers of a page in the background are
// throttled to one a second)
window.flood = (open, send) => {
  const out = { sent: 0, promises: [] };
  const turns = new MessageChannel();
  const tick = () => {
    if (!open() || out.sent >= FLOOD_CAP) return;
    const i = out.sent++;
    out.promises.push(Promise.resolve().then(() => send(i)).then(
      (v) => ['resolved', v], (e) => ['rejected', e.message, e.retry === true]));
    turns.port2.postMessage(null);
  };
  turns.port1.onmessage = tick;
  tick();
  return out;
};
// the settled outcomes of a flood, counted by kind
window.outcomes = async (out) => {
  const settled = await within(Promise.all(out.promises), 2000);
  if (settled === 'not settled') return 'not settled';
  const counts = {};
  for (const s of settled) {
    const kind = JSON.stringify(s);
    counts[kind] = (counts[kind] || 0) + 1;
  }
  return counts;
};
// a stream request of our library as a Promise: its parts, or its error's message
window.streamed = (sock, op, parts) => new Promise((resolve, reject) => {
  const got = [];
  const st = sock.streamRequest(op);
  st.on('data', (d) => got.push(gotalk.utf8.decode(d)));
  st.on('end', () => resolve(got));
  st.on('error', reject);
  for (const p of parts) st.write(p);
  st.end();
});
"""
PAGE = f"""<!doctype html><meta charset="utf-8"><title>review 175</title>
<link rel="icon" href="data:,">
<script src="/gotalk/gotalk.js"></script><script src="/gotalk121_wire.js"></script>
<script>{HELPERS}</script>"""


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    async with browser_context(browser, 8000) as context:
        yield context


@pytest.fixture
def web(tmp_path: Path) -> HttpOptions:
    (tmp_path / "index.html").write_text(PAGE)
    shutil.copy(WIRE121, tmp_path / WIRE121.name)
    return HttpOptions(static_dir=tmp_path)


class Ran:
    """A registry whose handlers record what ran: ``hold`` (until ``release``), ``echo``,
    ``slow`` (a short sleep), the stream ``stream``, the notification ``note``; ``ask``
    calls the page's ``relay`` once ``go`` is set."""

    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.release = asyncio.Event()
        self.go = asyncio.Event()
        self.registry = registry = rpc.Registry()

        @registry.handle("hold")
        async def hold(_: Any = None) -> str:
            await self.release.wait()
            return "held"

        @registry.handle("echo")
        def echo(value: Any) -> Any:
            self.ran.append(("echo", value))
            return value

        @registry.handle("slow")
        async def slow(value: Any) -> Any:
            await asyncio.sleep(0.02)  # its work, not a wait for anything
            return value

        @registry.handle_stream("stream")
        async def stream(parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            async for part in parts:
                self.ran.append(("stream", part))
                yield part

        @registry.handle_notification("note")
        def note(value: Any) -> None:
            self.ran.append(("note", value))

        @registry.handle("ask")
        async def ask(value: Any) -> Any:
            await self.go.wait()
            return await rpc.current_peer.get().request("relay", value, timeout=5)


async def open_page(context: BrowserContext, server: Any) -> tuple[Page, list[str], str]:
    page = await context.new_page()
    errors = page_errors(page)
    await page.goto(f"http://127.0.0.1:{server.url.port}/")
    return page, errors, f"ws://127.0.0.1:{server.url.port}/gotalk/"


async def page_until(page: Page, expression: str, timeout: float = 5.0) -> None:
    """Poll ``expression`` in ``page`` until it holds (Playwright's ``wait_for_function``
    polls on animation frames, which a page in the background does not get)."""
    try:
        async with asyncio.timeout(timeout):
            while not await page.evaluate(expression):
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {expression}") from None


def json_key(*outcome: Any) -> str:
    """An outcome as ``outcomes`` counts it."""
    return json.dumps(list(outcome), separators=(",", ":"))


async def begin_close(server: Any) -> tuple[Any, asyncio.Future[None]]:
    """The one connection's graceful close, begun (``gave_up`` set) when this returns."""
    [peer] = server.peers
    closing = asyncio.ensure_future(peer.close(drain_timeout=DRAIN))
    await eventually(lambda: peer.gave_up is not None, "the close began")
    return peer, closing


async def close_ends_promptly(ran: Ran, closing: asyncio.Future[None]) -> float:
    """Release ``hold``; the seconds the close then takes."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    ran.release.set()
    await asyncio.wait_for(closing, DRAIN + 2)
    return loop.time() - began


WIRE_FLOOD = """() => {
  const open = () => !w.log.closed;
  window.singles = flood(open, (i) => w.request('echo', i));
  window.streams = flood(open, (i) => {
    const st = w.streamRequest('stream');
    st.write(i); st.end();
    return st.done;
  });
  window.notes = flood(open, (i) => { w.notify('note', i); return 'sent'; });
}"""
"""gotalk.js on the wire (``w``) floods while its connection is open: requests
(``singles``), stream requests (``streams``) and notifications (``notes``)."""

"""A real browser peer (Debian's chromium) through a peerwire server's graceful close,
which turns away what a peer without retry results sends once it began (822903f, 7679166,
5b69d42; review 175): ``tests/gotalk121_wire.js`` (gotalk.js 1.2.1 on the wire, no
retry results) and our library (transports/web/*.js: it announces retry results, so it gets
none only from a ``retry_results=False`` server, and CLOSING ones otherwise). The page keeps
sending requests, stream requests and notifications throughout the close: its pending calls
must fail as the connection closes, the close must end as soon as what it sent before is
answered (not at ``drain_timeout``), and what it sent before is answered. Three tests are
of a defect fixed in ac76941: what was turned away first waited for a handler slot, so
while the slots were taken a flood during the close filled the backlog and reading paused,
and the parts of a running stream request, or the reply to a handler's call, were never
read: the close ran to ``drain_timeout`` and cut them. Real sockets on 127.0.0.1; the waits
are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page

import rpc
from rpc.errors import CLOSING
from tests.browser import browser_context, browser_fixture, eventually, page_errors
from transports.websocket import HttpOptions
from wire import gotalk

__all__ = ["browser_fixture"]  # the module's Chromium, a fixture used here
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

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
            await asyncio.sleep(0.02)
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


# --- gotalk.js 1.2.1 on the wire (no retry results) --------------------------------------------

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


async def test_wire121_page_flooding_the_close_gets_its_answer_and_fails_the_rest_promptly(
    context: BrowserContext, web: HttpOptions
) -> None:
    """gotalk.js on the wire sends requests, stream requests and notifications on every tick
    from the close's start: none runs, the request it sent before (``hold``) is answered,
    the close ends once that is, and every pending call fails as the connection closes."""
    ran = Ran()
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, web=web
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            window.held = w.request('hold', null).then((v) => v, (e) => 'rejected: ' + e.message);
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and next(iter(server.peers)).handlers_running == 1, "hold runs"
        )
        _, closing = await begin_close(server)
        await page.evaluate(WIRE_FLOOD)
        await page_until(page, "singles.sent >= 30 && streams.sent >= 30")
        took = await close_ends_promptly(ran, closing)
        result = await page.evaluate(
            """async () => ({
            held: await within(held, 2000),
            closed: await within(new Promise((resolve) => {
              const look = () => w.log.closed ? resolve(w.log.closed.code) : setTimeout(look, 5);
              look();
            }), 2000),
            singles: await outcomes(singles), streams: await outcomes(streams),
            faults: w.log.faults})"""
        )
    assert result["held"] == "held"
    assert result["closed"] == 1000
    assert result["faults"] == []
    failed = json_key("rejected", "connection closed", False)
    assert list(result["singles"]) == [failed], result["singles"]
    assert list(result["streams"]) == [failed], result["streams"]
    assert ran.ran == []
    assert took < PROMPT, took
    assert errors == []


# --- our library --------------------------------------------------------------------------------

OURS_OPEN = """async (url) => {
  window.sock = await new Promise((resolve, reject) =>
    gotalk.open(url, (err, s) => err ? reject(err) : resolve(s)));
  window.closedAt = null;
  sock.on('close', () => { closedAt = performance.now(); });
  window.held = sock.request('hold', null).then((v) => v, (e) => 'rejected: ' + e.message);
}"""

OURS_FLOOD = """() => {
  const open = () => sock.isOpen;
  window.singles = flood(open, (i) => sock.request('echo', i));
  window.streams = flood(open, (i) => streamed(sock, 'stream', [String(i)]));
  window.notes = flood(open, (i) => { sock.notify('note', i); return 'sent'; });
}"""

OURS_RESULT = """async () => ({
  held: await within(held, 2000),
  closed: await within(new Promise((resolve) => {
    const look = () => closedAt !== null ? resolve(true) : setTimeout(look, 5);
    look();
  }), 2000),
  singles: await outcomes(singles), streams: await outcomes(streams)})"""


@pytest.mark.parametrize("retry_results", [False, None], ids=["no-retry-server", "retry"])
async def test_our_library_flooding_the_close_gets_its_answer_and_fails_the_rest_promptly(
    context: BrowserContext, web: HttpOptions, retry_results: bool | None
) -> None:
    """Our library, as above: from a ``retry_results=False`` server it gets nothing for what
    it sends during the close (its calls fail as the connection closes, "socket is
    closed"); from one that takes its announcement, CLOSING retry results (its calls fail
    then with ``err.retry``). Either way the close ends once ``hold`` is answered."""
    ran = Ran()
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=ran.registry,
        web=web,
        retry_results=retry_results,
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(OURS_OPEN, url)
        await eventually(
            lambda: server.peers and next(iter(server.peers)).handlers_running == 1, "hold runs"
        )
        _, closing = await begin_close(server)
        await page.evaluate(OURS_FLOOD)
        await page_until(page, "singles.sent >= 30 && streams.sent >= 30")
        took = await close_ends_promptly(ran, closing)
        result = await page.evaluate(OURS_RESULT)
    assert result["held"] == "held"
    assert result["closed"] is True
    if retry_results is False:
        failed = [json_key("rejected", "socket is closed", False)]
    else:
        failed = [
            json_key("rejected", CLOSING, True),
            json_key("rejected", "socket is closed", False),
        ]
    assert set(result["singles"]) <= set(failed), result["singles"]
    assert set(result["streams"]) <= set(failed), result["streams"]
    # (a retry-taking peer's notifications run during the close: they are not refused)
    assert [r for r in ran.ran if retry_results is False or r[0] != "note"] == []
    assert took < PROMPT, took
    assert errors == []


async def test_our_library_page_calling_back_into_the_servers_call_during_the_close(
    context: BrowserContext, web: HttpOptions
) -> None:
    """A no-retry server's handler of ``ask`` (sent before the close) calls the page back
    once the close began; the page's handler sends ``echo`` and awaits it, starts a stream
    request, answers, and only then sends the stream's second part and its end. The echo
    runs (our call is in flight), the stream request runs and takes its late part, ``ask``
    is answered, and the close ends then; what the page sends meanwhile with no call of
    ours in flight (a flood) never fails the page's other calls but by the close."""
    ran = Ran()
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, web=web, retry_results=False
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.late = null;
            gotalk.handle('relay', async (v) => {
              const one = await sock.request('echo', 'inner ' + v);
              const got = [];
              const st = sock.streamRequest('stream');
              late = new Promise((resolve) => {
                st.on('data', (d) => got.push(gotalk.utf8.decode(d)));
                st.on('end', () => resolve(got));
                st.on('error', (e) => resolve('error: ' + e.message));
              });
              st.write('a');
              setTimeout(() => { st.write('b'); st.end(); }, 0);  // after the answer
              return one;
            });
            window.sock = await new Promise((resolve, reject) =>
              gotalk.open(url, (err, s) => err ? reject(err) : resolve(s)));
            window.asked = sock.request('ask', 'x').then((v) => v, (e) => 'rejected: ' + e.message);
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and next(iter(server.peers)).handlers_running == 1, "ask runs"
        )
        _, closing = await begin_close(server)
        await page.evaluate(
            "() => { window.singles = flood(() => sock.isOpen, (i) => sock.request('slow', i)); }"
        )
        await page_until(page, "singles.sent >= 20")
        loop = asyncio.get_running_loop()
        began = loop.time()
        ran.go.set()
        await asyncio.wait_for(closing, DRAIN + 2)
        took = loop.time() - began
        result = await page.evaluate(
            """async () => ({asked: await within(asked, 2000), late: await within(late, 2000),
                         singles: await outcomes(singles)})"""
        )
    assert result["asked"] == "inner x"
    assert result["late"] == ["a", "b"]
    assert ("echo", "inner x") in ran.ran
    assert [r for r in ran.ran if r[0] == "stream"] == [("stream", b"a"), ("stream", b"b")]
    allowed = {json_key("rejected", "socket is closed", False)}
    assert {k for k in result["singles"] if not k.startswith('["resolved"')} <= allowed
    assert took < PROMPT, took
    assert errors == []


async def test_wire121_requests_kept_behind_slots_at_the_close_are_all_answered(
    context: BrowserContext, web: HttpOptions
) -> None:
    """gotalk.js on the wire takes both handler slots (two ``hold``) and sends 10 ``echo``
    requests, kept unrun; the close begins once all are read, and the page floods it: once
    the holds end, the 10 are answered, the flood fails at the close, which ends then."""
    ran = Ran()
    options = rpc.Options(max_concurrent=2)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, options=options, web=web
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            const settle = (p) => p.then((v) => v, (e) => 'rejected: ' + e.message);
            window.held = Promise.all([settle(w.request('hold', 1)), settle(w.request('hold', 2))]);
            window.before = Promise.all(Array.from({length: 10}, (_, i) =>
              settle(w.request('echo', i))));
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and len(next(iter(server.peers))._kept) >= 10, "10 requests kept"
        )
        _, closing = await begin_close(server)
        await page.evaluate(WIRE_FLOOD)
        await page_until(page, "singles.sent >= 30 && streams.sent >= 30")
        took = await close_ends_promptly(ran, closing)
        result = await page.evaluate(
            """async () => ({held: await within(held, 2000), before: await within(before, 2000),
                           singles: await outcomes(singles)})"""
        )
    assert result["held"] == ["held", "held"]
    assert result["before"] == list(range(10))
    assert list(result["singles"]) == [json_key("rejected", "connection closed", False)]
    assert ran.ran == [("echo", i) for i in range(10)]
    assert took < PROMPT, took
    assert errors == []


@pytest.mark.parametrize(
    "send",
    ["w.request('echo', payload)", "w.notify('note', payload)"],
    ids=["requests", "notifications"],
)
async def test_wire121_stream_parts_are_read_while_a_flood_waits_for_the_slot_it_holds(
    context: BrowserContext, web: HttpOptions, send: str
) -> None:
    """gotalk.js on the wire has a stream request running in the server's one handler slot
    (``max_concurrent=1``) when the close begins; it then sends 100 requests, or
    notifications, of 1 KiB (turned away: sent during the close, no call of ours in
    flight), then the stream's last part and its end. The stream must end (its parts are
    read throughout the close) and the close with it. They were not: what is turned away
    first waits for a handler slot (``InputFlow._run`` holds any message but a reply or a
    running request's part or cancellation while the slots are taken, before dispatch; and
    ``Responder.refuses`` raises NoTaskSlot for a peer without retry results before it asks
    ``turned_away``), so the flood is kept in the backlog until it is full (a quarter of
    ``max_request_bytes``, or 16,384 messages), reading pauses, the stream's parts are never
    read, and the close runs to ``drain_timeout`` and cuts the stream. (With the default
    options 17,000 tiny requests do the same: 16,384 kept; too slow for a test here.)"""
    ran = Ran()
    options = rpc.Options(max_concurrent=1, max_request_bytes=64 * 1024)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, options=options, web=web
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            window.st = w.streamRequest('stream');
            st.write('a');
            window.done = st.done.then((v) => v, (e) => 'rejected: ' + e.message);
        }""",
            url,
        )
        await eventually(lambda: ran.ran == [("stream", b'"a"')], "the stream runs")
        [peer] = server.peers
        closing = asyncio.ensure_future(peer.close(drain_timeout=SHORT_DRAIN))
        await eventually(lambda: peer.gave_up is not None, "the close began")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await page.evaluate(
            """(send) => {
            const payload = 'x'.repeat(1024);
            for (let i = 0; i < 100; i++) Promise.resolve(eval(send)).catch(() => null);
            st.write('b');
            st.end();
        }""",
            send,
        )
        await asyncio.wait_for(closing, SHORT_DRAIN + 2)
        took = loop.time() - began
        result = await page.evaluate("async () => await within(done, 2000)")
    assert result == ["a", "b"]
    assert took < PROMPT, took
    assert errors == []


async def test_our_library_reply_is_read_while_a_flood_waits_for_the_slot_its_caller_holds(
    context: BrowserContext, web: HttpOptions
) -> None:
    """The same defect, for a handler calling the page back: a no-retry server's one slot
    runs ``ask`` (sent before the close); the page sends 100 requests of 1 KiB once the
    close began (turned away), then the handler calls the page, which answers at once. The
    reply must be read (the peer is read throughout the close) and ``ask`` answered; the
    flood kept for the slot fills the backlog instead, reading pauses, and the call waits
    until the drain's end cuts it."""
    ran = Ran()
    options = rpc.Options(max_concurrent=1, max_request_bytes=64 * 1024)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=ran.registry,
        options=options,
        web=web,
        retry_results=False,
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            gotalk.handle('relay', (v) => 'relayed ' + v);
            window.sock = await new Promise((resolve, reject) =>
              gotalk.open(url, (err, s) => err ? reject(err) : resolve(s)));
            window.asked = sock.request('ask', 'x').then((v) => v, (e) => 'rejected: ' + e.message);
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and next(iter(server.peers)).handlers_running == 1, "ask runs"
        )
        [peer] = server.peers
        closing = asyncio.ensure_future(peer.close(drain_timeout=SHORT_DRAIN))
        await eventually(lambda: peer.gave_up is not None, "the close began")
        beats = peer.adapter.liveness.heartbeats_received
        await page.evaluate(
            """() => {
            const payload = 'x'.repeat(1024);
            window.flooded = Array.from({length: 100}, () =>
              sock.request('echo', payload).then(() => 'resolved', (e) => e.message));
            sock.sendHeartbeat(0);  // behind the flood: kept (no slot) once it was read
        }"""
        )
        kept = peer._kept
        await eventually(  # (the flood kept till reading paused, or read and dropped,
            lambda: (
                kept.full  # the heartbeat behind it kept or heard)
                or any(m.__class__ is gotalk.Heartbeat for m in kept.messages)
                or peer.adapter.liveness.heartbeats_received > beats
            ),
            "the flood read",
        )
        loop = asyncio.get_running_loop()
        began = loop.time()
        ran.go.set()
        await asyncio.wait_for(closing, SHORT_DRAIN + 2)
        took = loop.time() - began
        result = await page.evaluate("async () => await within(asked, 2000)")
    assert result == "relayed x"
    assert took < PROMPT, took
    assert errors == []


async def test_wire121_stream_request_kept_at_the_close_takes_the_parts_sent_during_it(
    context: BrowserContext, web: HttpOptions
) -> None:
    """gotalk.js on the wire: ``hold`` takes the one slot, a stream request is read behind it
    (kept), the close begins, then the page sends the stream's second part and its end and
    a request: once ``hold`` ends the stream runs with both parts and is answered, the
    request fails at the close, which ends then."""
    ran = Ran()
    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, options=options, web=web
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            const settle = (p) => p.then((v) => v, (e) => 'rejected: ' + e.message);
            window.held = settle(w.request('hold', null));
            window.st = w.streamRequest('stream');
            st.write('a');
            window.done = settle(st.done);
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and len(next(iter(server.peers))._kept) >= 1,
            "the stream request kept",
        )
        _, closing = await begin_close(server)
        await page.evaluate(
            """() => {
            st.write('b');
            st.end();
            window.late = w.request('echo', 'late').then((v) => v, (e) => 'rejected: ' + e.message);
        }"""
        )
        took = await close_ends_promptly(ran, closing)
        result = await page.evaluate(
            """async () => [await within(held, 2000), await within(done, 2000),
                            await within(late, 2000)]"""
        )
    assert result == ["held", ["a", "b"], "rejected: connection closed"]
    assert ran.ran == [("stream", b'"a"'), ("stream", b'"b"')]
    assert took < PROMPT, took
    assert errors == []


async def test_our_library_request_sent_during_our_call_and_kept_past_it_runs(
    context: BrowserContext, web: HttpOptions
) -> None:
    """A no-retry server with two slots, both taken (``ask``, ``hold``) when the close
    begins; ``ask`` calls the page back, whose handler sends ``echo`` (kept: no slot) and
    awaits it before it answers. Once ``hold`` ends, ``echo`` runs (read during our call),
    the page answers, ``ask`` is answered and the close ends."""
    ran = Ran()
    options = rpc.Options(max_concurrent=2)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=ran.registry,
        options=options,
        web=web,
        retry_results=False,
    ) as server:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.relayed = false;
            gotalk.handle('relay', async (v) => {
              relayed = true;
              return await sock.request('echo', 'inner ' + v);
            });
            window.sock = await new Promise((resolve, reject) =>
              gotalk.open(url, (err, s) => err ? reject(err) : resolve(s)));
            const settle = (p) => p.then((v) => v, (e) => 'rejected: ' + e.message);
            window.asked = settle(sock.request('ask', 'x'));
            window.held = settle(sock.request('hold', null));
        }""",
            url,
        )
        await eventually(
            lambda: server.peers and next(iter(server.peers)).handlers_running == 2,
            "ask and hold run",
        )
        peer, closing = await begin_close(server)
        ran.go.set()
        await page_until(page, "relayed")
        await eventually(lambda: len(peer._kept) >= 1, "echo kept")
        took = await close_ends_promptly(ran, closing)
        result = await page.evaluate(
            "async () => [await within(asked, 2000), await within(held, 2000)]"
        )
    assert result == ["inner x", "held"]
    assert ran.ran == [("echo", "inner x")]
    assert took < PROMPT, took
    assert errors == []


# --- the whole server: server.close() and `peerwire serve` on SIGTERM ---------------------------


async def test_server_close_with_a_page_flooding_on_two_connections(
    context: BrowserContext, web: HttpOptions
) -> None:
    """``server.close()`` with a busy page on two connections, gotalk.js on the wire and our
    library (which takes CLOSING retry results): each gets its ``hold`` answered, its flood
    fails at the close, and the server's close ends once the holds are answered. (One page:
    a page in the background gets its timers and turns throttled.)"""
    ran = Ran()
    server = rpc.serve("ws+gotalk://127.0.0.1:0/gotalk/", registry=ran.registry, web=web)
    await server.start()
    try:
        page, errors, url = await open_page(context, server)
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            const settle = (p) => p.then((v) => v, (e) => 'rejected: ' + e.message);
            window.wireHeld = settle(w.request('hold', null));
        }""",
            url,
        )
        await page.evaluate(OURS_OPEN, url)
        await eventually(
            lambda: len(server.peers) == 2 and all(p.handlers_running == 1 for p in server.peers),
            "both holds run",
        )
        closing = asyncio.ensure_future(server.close(drain_timeout=DRAIN))
        await eventually(lambda: all(p.gave_up is not None for p in server.peers), "closing")
        await page.evaluate(
            "() => { window.wire = flood(() => !w.log.closed, (i) => w.request('echo', i)); }"
        )
        await page.evaluate(OURS_FLOOD)
        await page_until(page, "wire.sent >= 30 && singles.sent >= 30")
        took = await close_ends_promptly(ran, closing)
    finally:
        ran.release.set()
        await server.close(drain_timeout=0)
    result = await page.evaluate(
        """async () => ({wireHeld: await within(wireHeld, 2000), held: await within(held, 2000),
                       wire: await outcomes(wire), singles: await outcomes(singles)})"""
    )
    assert result["wireHeld"] == result["held"] == "held"
    assert list(result["wire"]) == [json_key("rejected", "connection closed", False)]
    assert set(result["singles"]) <= {
        json_key("rejected", CLOSING, True),
        json_key("rejected", "socket is closed", False),
    }
    assert [r for r in ran.ran if r[0] != "note"] == []  # (ours: its notifications run)
    assert took < PROMPT, took
    assert errors == []


HOLD = 0.6
"""Seconds the served ``hold`` takes: the page floods the close meanwhile."""
SERVED = f"""
import asyncio
import rpc

HOLD = {HOLD}

registry = rpc.Registry()


@registry.handle("hold")
async def hold(_=None):
    peer = rpc.current_peer.get()
    print("hold began", flush=True)
    while peer.gave_up is None:  # (polled: the test's module knows no close event)
        await asyncio.sleep(0.005)
    print("close began", flush=True)
    await asyncio.sleep(HOLD)
    return "held"


@registry.handle("echo")
def echo(value):
    print("echo ran", flush=True)
    return value
"""


async def test_peerwire_serve_on_sigterm_with_a_flooding_page(
    context: BrowserContext, tmp_path: Path
) -> None:
    """``peerwire serve`` gets SIGTERM while gotalk.js on the wire waits for ``hold``, and the
    page floods the close: the page gets ``hold``'s answer, its flood fails at the close
    (none of it runs), and the process exits 0 once ``hold`` is answered, not at
    ``--drain-timeout``."""
    module = tmp_path / "served.py"
    module.write_text(SERVED)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rpc.cli", "serve", str(module),
        "--listen=ws+gotalk://127.0.0.1:0/gotalk/", f"--drain-timeout={DRAIN}",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []

    async def line_with(text: str) -> str:
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
            if not line:
                raise AssertionError(f"serve exited before printing {text!r}: {lines}")
            lines.append(line.strip())
            if text in line:
                return line

    try:
        url = (await line_with("listening on ")).split()[-1]
        port = url.rsplit(":", 1)[1].split("/")[0]
        page = await context.new_page()
        errors = page_errors(page)
        await page.goto(f"http://127.0.0.1:{port}/gotalk/gotalk.js")  # same origin
        await page.add_script_tag(content=HELPERS)
        await page.add_script_tag(path=str(WIRE121))
        await page.evaluate(
            """async (url) => {
            window.w = new Wire121(url);
            await w.opened;
            window.held = w.request('hold', null).then((v) => v, (e) => 'rejected: ' + e.message);
        }""",
            f"ws://127.0.0.1:{port}/gotalk/",
        )
        await line_with("hold began")
        loop = asyncio.get_running_loop()
        began = loop.time()
        proc.send_signal(signal.SIGTERM)
        await line_with("close began")
        await page.evaluate(WIRE_FLOOD)
        rest = await asyncio.wait_for(proc.stdout.read(), DRAIN + 5)
        code = await proc.wait()
        took = loop.time() - began
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    result = await page.evaluate(
        "async () => ({held: await within(held, 2000), singles: await outcomes(singles)})"
    )
    assert code == 0, rest
    assert result["held"] == "held"
    assert list(result["singles"]) == [json_key("rejected", "connection closed", False)]
    assert "echo ran" not in rest.decode()
    assert took < HOLD + PROMPT, took
    assert errors == []

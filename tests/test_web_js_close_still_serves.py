"""While a peerwire server's graceful close turns away what a real browser peer (Debian's
chromium) floods it with (review 175), what the close owes the page still goes through:
requests kept behind taken handler slots are answered, a running or kept stream request
takes the parts sent during the close, a handler's call back into the page gets its reply,
and what the page sends during our call runs. ``tests/gotalk121_wire.js`` (gotalk.js 1.2.1
on the wire, no retry results) and our library (transports/web/*.js) against
``retry_results=False`` servers. Three tests are of a defect fixed in ac76941: what was
turned away first waited for a handler slot, so while the slots were taken a flood during
the close filled the backlog and reading paused, and the parts of a running stream
request, or the reply to a handler's call, were never read: the close ran to
``drain_timeout`` and cut them. Shared page and handlers: :mod:`tests.web_close_helpers`.
Real sockets on 127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import BrowserContext

import rpc
from tests.browser import browser_fixture, eventually
from tests.web_close_helpers import (
    DRAIN,
    PROMPT,
    SHORT_DRAIN,
    WIRE_FLOOD,
    Ran,
    begin_close,
    close_ends_promptly,
    context,
    json_key,
    open_page,
    page_until,
    web,
)
from transports.websocket import HttpOptions
from wire import gotalk

__all__ = ["browser_fixture", "context", "web"]  # the module's Chromium, its fixtures
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]


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

"""What the handlers holding the slots wait for is read while the peer's other input waits.

Either side can handle and request, so a handler may call back the peer that called it. When
every slot is taken by such handlers, what the peer sends next (a notification, a request to
a peer that takes no retry results) must wait; the replies those handlers wait for must
not wait behind it. Before, reading paused at the first message that found no slot, and
the handlers waited for their replies until their calls timed out. So must the parts of a
stream request whose handler holds a slot (found in review by helper-92: before, they waited
for a slot that only that handler's end would free, for good)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

import rpc
from tests.gotalk_raw import served_raw
from tests.rpc_helpers import FLAVOURS, served, wait_until
from wire import gotalk


def calling_back_registry(answers: list[object]) -> rpc.Registry:
    """``ask(n)``: a notification whose handler calls the peer's ``back`` with ``n`` and
    keeps the answer; ``ask_request(n)`` does the same as a request and returns it."""
    reg = rpc.Registry()

    @reg.handle_notification("ask")
    async def ask(value: int) -> None:
        answers.append(await rpc.current_peer.get().request("back", value, timeout=20))

    @reg.handle("ask_request")
    async def ask_request(value: int) -> object:
        return await rpc.current_peer.get().request("back", value, timeout=20)

    return reg


def back_registry(servers: list[rpc.Server]) -> rpc.Registry:
    """``back(n)``: ``n * 10``, answered only once a server of ``servers`` keeps some of
    the peer's input unrun (the first calls back wait for it): so the answers meet every
    slot taken and input waiting, whatever the timing."""
    reg = rpc.Registry()
    held = asyncio.Event()

    def holding() -> bool:
        return any(peer._kept.messages for server in servers for peer in server.peers)

    @reg.handle("back")
    async def back(value: int) -> object:
        if not held.is_set():
            await wait_until(holding)
            held.set()
        return value * 10

    return reg


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_notification_handlers_that_call_back_get_their_replies(flavour: str) -> None:
    answers: list[object] = []
    servers: list[rpc.Server] = []
    options = rpc.Options(max_concurrent=2)
    client_registry = back_registry(servers)
    async with served(
        flavour, calling_back_registry(answers), client_registry=client_registry, options=options
    ) as (server, peer):
        servers.append(server)
        for n in range(6):  # four find no slot and wait while the first two call back
            peer.notify("ask", n)
        await wait_until(lambda: len(answers) == 6, timeout=10)  # not their 20-s timeouts
        assert sorted(answers) == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_request_handlers_that_call_back_a_peer_without_retry_results(
    flavour: str,
) -> None:
    """A peer that takes no retry results gets none: its requests past the slots wait
    (kept), but the replies the running handlers wait for are read."""
    scheme, query = FLAVOURS[flavour]
    answers: list[object] = []
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0",
        registry=calling_back_registry(answers),
        options=rpc.Options(max_concurrent=1),
        retry_results=False,
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, registry=back_registry([server]), reconnect=False) as peer:
            async with asyncio.timeout(10):
                got = await asyncio.gather(*(peer.request("ask_request", n) for n in range(4)))
    assert got == [0, 10, 20, 30]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_handlers_holding_max_request_bytes_get_their_replies(flavour: str) -> None:
    """A request whose payload takes all of ``max_request_bytes`` has a handler that calls
    the peer back; the peer (without retry results) sends a request meanwhile, which waits
    for bytes. The reply is read: the backlog keeps its own share of the limit. Before, the
    backlog was full with that one request kept, reading paused, and the handler waited
    for its call's 20-s timeout."""
    scheme, query = FLAVOURS[flavour]
    reg = collecting_registry()

    @reg.handle("ask_big")
    async def ask_big(blob: str) -> object:
        answer = await rpc.current_peer.get().request("back", 1, timeout=20)
        return [len(blob), answer]

    async with rpc.serve(
        f"{scheme}://127.0.0.1:0",
        registry=reg,
        options=rpc.Options(max_concurrent=4, max_request_bytes=100_000),
        retry_results=False,
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        async with rpc.connect(url, registry=back_registry([server]), reconnect=False) as peer:
            async with asyncio.timeout(10):
                big = asyncio.ensure_future(peer.request("ask_big", "x" * 120_000))
                small = asyncio.ensure_future(peer.request("echo", "after"))
                assert await big == [120_000, 10]
                assert await small == "after"


class Events:
    """What the handlers of :func:`collecting_registry` wait for and tell."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        """``hold`` answers once it is set."""
        self.started = asyncio.Event()
        """``forever`` began."""
        self.cancelled = asyncio.Event()
        """``forever`` was cancelled."""


def collecting_registry(events: Events | None = None) -> rpc.Registry:
    """``collect``: a stream handler that returns the parts it got, in order; ``echo``;
    ``hold``, answered once ``events.gate`` is set; ``forever``, never answered."""
    reg = rpc.Registry()
    events = events or Events()

    @reg.handle_stream("collect")
    async def collect(parts: Any) -> list[Any]:
        return [part async for part in parts]

    @reg.handle("hold")
    async def hold(value: Any) -> Any:
        await events.gate.wait()
        return value

    @reg.handle("forever")
    async def forever(value: Any) -> Any:
        events.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.cancelled.set()
            raise

    reg.handle("echo")(lambda value: value)
    return reg


def no_retry_server(flavour: str, registry: rpc.Registry | None = None) -> Any:
    """A server of one handler slot for a peer without retry results."""
    scheme, _ = FLAVOURS[flavour]
    return rpc.serve(
        f"{scheme}://127.0.0.1:0",
        registry=registry or collecting_registry(),
        options=rpc.Options(max_concurrent=1),
        retry_results=False,
    )


def client_url(flavour: str, server: rpc.Server) -> str:
    scheme, query = FLAVOURS[flavour]
    return f"{scheme}://127.0.0.1:{server.url.port}{query}"


@contextlib.asynccontextmanager
async def one_slot(flavour: str, events: Events) -> AsyncIterator[tuple[rpc.Peer, rpc.Peer]]:
    """Our client and the server's peer of :func:`no_retry_server`, the extension agreed."""
    async with no_retry_server(flavour, collecting_registry(events)) as server:
        async with rpc.connect(client_url(flavour, server), reconnect=False) as peer:
            [server_peer] = server.peers
            await wait_until(lambda: peer.adapter.cancels and server_peer.adapter.cancels)
            yield peer, server_peer


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_stream_parts_reach_their_handler_while_it_holds_the_last_slot(
    flavour: str,
) -> None:
    async with no_retry_server(flavour) as server:
        async with rpc.connect(client_url(flavour, server), reconnect=False) as peer:
            async with asyncio.timeout(5):  # (the caller's own item timeout: 30 s, 5 s)
                got = [item async for item in peer.stream("collect", parts=[1, 2, 3, 4])]
    assert got == [[1, 2, 3, 4]]


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_stream_parts_overtake_a_request_waiting_for_a_slot(flavour: str) -> None:
    """A request that waits for the slot the stream's handler holds is kept; the stream's
    later parts run past it, in their order, and the request runs once the stream ends."""
    more = asyncio.Event()

    async def parts() -> AsyncIterator[int]:
        yield 1
        await more.wait()  # the request goes out between the parts
        for part in (2, 3, 4):
            yield part

    async with no_retry_server(flavour) as server:
        async with rpc.connect(client_url(flavour, server), reconnect=False) as peer:
            [server_peer] = server.peers

            async def streamed() -> list[Any]:
                return [item async for item in peer.stream("collect", parts=parts())]

            stream = asyncio.ensure_future(streamed())
            await wait_until(lambda: server_peer.handlers_running == 1)
            request = asyncio.ensure_future(peer.request("echo", "after"))
            await wait_until(lambda: server_peer._kept.messages)  # it waits for the slot
            more.set()
            async with asyncio.timeout(5):
                assert await stream == [[1, 2, 3, 4]]
                assert await request == "after"


async def test_stream_parts_kept_while_our_output_waited_run_once_it_drains() -> None:
    """Parts of a running stream read while our output waited (its own results: 1 MiB a
    part, unread) are kept behind a request that then waits for the stream's slot; once
    the output drains they run past it, in order, before reading goes on."""
    reg = rpc.Registry()

    @reg.handle_stream("sizes")
    async def sizes(parts: Any) -> AsyncIterator[bytes]:
        async for size in parts:
            yield b"x" * size

    @reg.handle("later")
    async def later(value: Any) -> Any:
        return value

    options = rpc.Options(max_concurrent=1, high_water=64 * 1024, low_water=16 * 1024)
    async with served_raw(reg, options, retry_results=False) as (raw, peer):
        # 64 KiB socket buffers both ways: loopback buffers grow to megabytes otherwise, and
        # as they took the results our output waited, then not, and the parts below ran
        # at once in such a gap (kept: only the request; failed under load)
        sock = peer.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock = raw.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        raw.write(gotalk.StreamRequest(b"0001", "sizes", b"1048576"))
        for _ in range(15):  # 16 MiB of results it does not read yet: output waits
            raw.write(gotalk.StreamRequestPart(b"0001", b"1048576"))
        await wait_until(lambda: peer.outbox.blocked)
        raw.request_alone(b"0100", "later", b'"after"')  # waits for the stream's slot
        for part in (b"7", b""):  # the stream's last part and its end
            raw.write(gotalk.StreamRequestPart(b"0001", part))
        kept = peer._kept.messages
        await wait_until(lambda: kept and kept[-1] == gotalk.StreamRequestPart(b"0001", b""))
        results: list[int] = []
        later_answer = None
        async with asyncio.timeout(10):  # now it reads: the output drains
            while later_answer is None or not results or results[-1]:
                message = await raw.next()
                if isinstance(message, gotalk.StreamResult):
                    results.append(len(message.payload))
                elif getattr(message, "id", None) == b"0100":
                    later_answer = message.payload
        assert results[-2:] == [7, 0] and len(results) == 18
        assert later_answer == b'"after"'


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_stream_parts_kept_behind_a_request_reach_their_handler_once_it_runs(
    flavour: str,
) -> None:
    """A stream request, a request and the stream's parts all kept while another handler
    holds the one slot: once it ends, the stream's handler takes the slot, and its parts,
    though read after the request that now waits for that slot, reach it. Before, they
    stayed behind that request: the stream's handler waited for them, the request for its
    slot, both until the connection's end (a peer without retry results)."""
    events = Events()
    more = asyncio.Event()

    async def parts() -> AsyncIterator[int]:
        yield 1  # (sent with the stream request)
        await more.wait()  # the request goes out between the stream request and its parts
        for part in (2, 3, 4):
            yield part

    async with one_slot(flavour, events) as (peer, server_peer):
        kept = server_peer._kept
        holding = asyncio.ensure_future(peer.request("hold", "held"))
        await wait_until(lambda: server_peer.handlers_running == 1)

        async def streamed() -> list[Any]:
            return [item async for item in peer.stream("collect", parts=parts())]

        stream = asyncio.ensure_future(streamed())
        await wait_until(lambda: len(kept) == 1)
        request = asyncio.ensure_future(peer.request("echo", "after"))
        await wait_until(lambda: len(kept) == 2)
        more.set()
        await wait_until(lambda: len(kept) >= 5)  # and three parts
        events.gate.set()
        async with asyncio.timeout(5):
            assert await holding == "held"
            assert await stream == [[1, 2, 3, 4]]
            assert await request == "after"


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_cancel_reaches_its_running_handler_past_a_request_waiting_for_its_slot(
    flavour: str,
) -> None:
    """The caller gives up on a call whose handler holds the one slot, after it sent a
    request that waits for that slot: the cancellation runs at once, the handler is
    cancelled and the request runs. Before, the cancellation was kept behind the request,
    which waited for the slot that only the cancellation would free (a peer without retry
    results; the handler never ends on its own)."""
    events = Events()
    async with one_slot(flavour, events) as (peer, server_peer):
        call = asyncio.ensure_future(peer.request("forever", 1))
        await events.started.wait()
        request = asyncio.ensure_future(peer.request("echo", "after"))
        await wait_until(lambda: len(server_peer._kept) == 1)  # it waits for the slot
        call.cancel()  # the caller gives up: a cancellation goes out
        async with asyncio.timeout(5):
            await events.cancelled.wait()
            assert await request == "after"
        assert call.cancelled()


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_a_cancel_kept_before_its_handler_ran_reaches_it_past_a_waiting_request(
    flavour: str,
) -> None:
    """The one slot is held; the caller sends ``forever`` and then ``echo`` (both kept,
    waiting for the slot), then gives up on ``forever``: its cancellation is kept too,
    behind ``echo``, as ``forever`` does not run yet. Once the slot frees, ``forever``
    takes it and ``echo`` waits for it: the cancellation must still reach ``forever``'s
    handler (it is for a running handler now), else ``echo`` waits for a slot that only
    that cancellation frees (a peer without retry results; the handler never ends on its
    own). Found in review by helper-96: 8a3a50a ran a cancellation past the rest only when
    read while its handler ran; kept before, it stayed behind ``echo``, which never ran."""
    events = Events()
    async with one_slot(flavour, events) as (peer, server_peer):
        kept = server_peer._kept
        holding = asyncio.ensure_future(peer.request("hold", "held"))
        await wait_until(lambda: server_peer.handlers_running == 1)
        call = asyncio.ensure_future(peer.request("forever", 1))
        await wait_until(lambda: len(kept) == 1)
        request = asyncio.ensure_future(peer.request("echo", "after"))
        await wait_until(lambda: len(kept) == 2)
        call.cancel()  # forever is kept, not running: its cancellation is kept too
        await wait_until(lambda: len(kept) == 3)
        events.gate.set()
        async with asyncio.timeout(5):
            assert await holding == "held"
            assert await request == "after"  # the slot freed: forever went
        assert call.cancelled()
        # cancelled, or dropped unrun
        assert events.cancelled.is_set() or not events.started.is_set()

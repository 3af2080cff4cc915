"""rpc.notifications.run_notification: the one notification dispatch of peers and group
nodes (failures logged, coroutine handlers as tasks, the group's task bound)."""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any

import pytest

import rpc
from rpc.notifications import run_notification
from rpc.tasks import TaskSet
from tests.rpc_helpers import FLAVOURS, served, wait_until


async def test_bounded_tasks_and_failures_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    reg = rpc.Registry()
    release = asyncio.Event()
    started = asyncio.Event()
    seen: list[object] = []

    @reg.handle_notification("slow")
    async def slow(value: int) -> None:
        seen.append(value)
        started.set()
        await release.wait()

    @reg.handle_notification("bad")
    def bad(value: int) -> None:
        raise ValueError(f"bad {value}")

    @reg.handle_notification("bad_async")
    async def bad_async(value: int) -> None:
        raise ValueError(f"bad async {value}")

    tasks = TaskSet(asyncio.get_running_loop())
    slow_handler = reg.get_notification("slow")
    assert slow_handler is not None
    with caplog.at_level(logging.WARNING, logger="peerwire.rpc"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused coroutine is closed, never "not awaited"
        assert run_notification(slow_handler, 1, tasks, max_tasks=1)
        assert not run_notification(slow_handler, 2, tasks, max_tasks=1)
        await asyncio.wait_for(started.wait(), 5)
        assert seen == [1] and len(tasks) == 1
        assert "handler 'slow' not run: 1 handlers already running" in caplog.text

        bad_handler = reg.get_notification("bad")
        bad_async_handler = reg.get_notification("bad_async")
        assert bad_handler is not None and bad_async_handler is not None
        assert run_notification(bad_handler, 3, tasks)  # it ran: its failure is logged
        assert run_notification(bad_async_handler, 4, tasks)
        release.set()
        assert await tasks.wait(5)
    failures = [r.getMessage() for r in caplog.records if r.exc_info]
    assert failures == [
        "notification handler 'bad' failed",
        "notification handler 'bad_async' failed",
    ]


async def test_a_peer_runs_its_handlers_with_current_peer_and_survives_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = rpc.Registry()
    got: asyncio.Queue[tuple[str, object]] = asyncio.Queue()

    @reg.handle_notification("fail")
    async def fail(value: int) -> None:
        raise RuntimeError("handler broke")

    @reg.handle_notification("who")
    async def who(value: int) -> None:
        await got.put((rpc.current_peer.get().remote_address[0], value))

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    with caplog.at_level(logging.ERROR, logger="peerwire.rpc"):
        async with served("gotalk", reg) as (_, peer):
            peer.notify("fail", 1)
            peer.notify("who", 2)
            assert await asyncio.wait_for(got.get(), 5) == ("127.0.0.1", 2)
            assert await peer.request("echo", "still open") == "still open"
    assert "notification handler 'fail' failed" in caplog.text


async def _pass_through(call: rpc.Call, call_next: Any) -> Any:
    return await call_next(call)


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
@pytest.mark.parametrize("middleware", [False, True])
async def test_a_notification_flood_is_slowed_not_spawned(flavour: str, middleware: bool) -> None:
    """Coroutine notification handlers are tasks of the connection: at most max_concurrent
    run; past that the server keeps what the peer sends, up to the backlog's bound
    (``max_request_bytes``), then stops reading from it until one ends, on a peer that
    takes retry results too (they are for requests; a notification has no answer)."""
    reg = rpc.Registry()
    release = asyncio.Event()
    running = 0
    most = 0
    done = 0

    @reg.handle_notification("slow")
    async def slow(value: int) -> None:
        nonlocal running, most, done
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
            done += 1

    @reg.handle("echo")
    def echo(value: object) -> object:
        return value

    options = rpc.Options(max_concurrent=4, max_request_bytes=8 * 1024)
    chain = {"middleware": [_pass_through]} if middleware else {}
    async with served(flavour, reg, options=options, **chain) as (server, peer):
        for i in range(50):
            peer.notify("slow", i)
        after = asyncio.ensure_future(peer.request("echo", "after", timeout=10))
        await wait_until(lambda: running == 4)
        [server_peer] = server.peers
        await wait_until(lambda: not server_peer.transport.is_reading())
        assert (most, done, server_peer.handlers_running) == (4, 0, 4)
        assert server_peer._kept.full  # (256 bytes counted a message; its read kept whole)
        release.set()
        assert await after == "after"
        await wait_until(lambda: done == 50)
        assert most == 4


def working_registry() -> tuple[rpc.Registry, list[float]]:
    """``work(seconds)``, a notification whose handler works that long (then the list it
    returns gets the seconds), and ``echo``."""
    reg = rpc.Registry()
    done: list[float] = []

    @reg.handle_notification("work")
    async def work(seconds: float) -> None:
        await asyncio.sleep(seconds)  # the work itself
        done.append(seconds)

    reg.handle("echo")(lambda value: value)
    return reg, done


@pytest.mark.parametrize(
    ("flavour", "liveness"),
    [
        ("gotalk", {"heartbeat_interval": 0.1, "read_timeout": 0.4}),
        ("chatter-current", {"ping_interval": 0.2, "ping_timeout": 0.2}),
    ],
)
async def test_held_input_does_not_count_as_a_silent_peer(
    flavour: str, liveness: dict[str, float]
) -> None:
    """While the server holds a peer's input (its notification tasks all taken, the backlog
    full), the peer's heartbeats or Pongs wait unread: that is not silence, and the
    connection lives past the liveness limits until the handlers end."""
    reg, done = working_registry()
    options = rpc.Options(max_concurrent=1, max_request_bytes=1024)
    async with served(flavour, reg, options=options, **liveness) as (server, peer):
        peer.notify("work", 1.0)  # the others wait a second: more than the liveness limits
        for _ in range(8):  # at 256 bytes counted each, 4 fill the backlog: reading pauses
            peer.notify("work", 0.0)
        [server_peer] = server.peers
        await wait_until(lambda: not server_peer.transport.is_reading())
        await wait_until(lambda: done == [1.0] + [0.0] * 8, timeout=10)
        assert peer.is_open and server_peer.is_open
        assert await peer.request("echo", "alive") == "alive"


@pytest.mark.parametrize("flavour", ["gotalk", "chatter-current"])
async def test_max_concurrent_zero_refuses_requests_and_still_runs_notifications(
    flavour: str,
) -> None:
    """``max_concurrent=0`` answers every request with a retry result; a notification,
    which cannot be refused, runs (one at a time) instead of holding the input for good."""
    reg = rpc.Registry()
    got: asyncio.Queue[int] = asyncio.Queue()

    @reg.handle_notification("note")
    async def note(value: int) -> None:
        await got.put(value)

    reg.handle("echo")(lambda value: value)
    busy = rpc.Options(max_concurrent=0, retry_wait=0.01)
    async with served(flavour, reg, options=busy, client_options=rpc.Options(retries=0)) as (
        _,
        peer,
    ):
        peer.notify("note", 1)
        peer.notify("note", 2)
        with pytest.raises(rpc.RetryLater):
            await peer.request("echo", "refused", timeout=5)
        assert [await asyncio.wait_for(got.get(), 5) for _ in range(2)] == [1, 2]


@pytest.mark.parametrize(
    ("flavour", "liveness"),
    [
        ("gotalk", {"read_timeout": 0.3}),
        ("chatter-current", {"ping_interval": 0.2, "ping_timeout": 0.2}),
    ],
)
async def test_input_held_for_good_is_silence_after_all(
    flavour: str, liveness: dict[str, float]
) -> None:
    """``max_concurrent=0`` on a peer that takes no retry results holds every request, and
    nothing will end the hold: the liveness checks count the peer silent as usual (before,
    such a connection stayed open for good, its input unread)."""
    reg = rpc.Registry()
    reg.handle("echo")(lambda value: value)
    scheme, query = FLAVOURS[flavour]
    held = rpc.Options(max_concurrent=0)
    async with rpc.serve(
        f"{scheme}://127.0.0.1:0", registry=reg, options=held, retry_results=False, **liveness
    ) as server:
        url = f"{scheme}://127.0.0.1:{server.url.port}{query}"
        peer = await rpc.connect(url, registry=rpc.Registry(), reconnect=False)
        call = asyncio.ensure_future(peer.request("echo", "held", timeout=10))
        async with asyncio.timeout(5):
            await asyncio.shield(peer.closed)  # the server closed it
        with pytest.raises(rpc.ConnectionClosed):
            await call
        await peer.close()


async def test_a_peer_hears_from_us_as_soon_as_we_hold_its_input() -> None:
    """Our own Ping plan is long (30 s) and the client's short: once we hold its input we
    Ping it twice per ``ping_timeout``, so its checks (which cannot see its Pongs read)
    still hear from us, and it keeps the connection."""
    reg, done = working_registry()
    options = rpc.Options(max_concurrent=1)
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=reg, options=options, ping_interval=30, ping_timeout=0.4
    ) as server:
        url = f"{server.url}?dialect=HatChatter"
        async with rpc.connect(
            url, registry=rpc.Registry(), reconnect=False, ping_interval=0.3, ping_timeout=0.3
        ) as peer:
            peer.notify("work", 1.0)
            peer.notify("work", 1.0)  # held a second: over three of the client's periods
            await wait_until(lambda: done == [1.0, 1.0], timeout=10)
            assert peer.is_open
            assert await peer.request("echo", "alive") == "alive"

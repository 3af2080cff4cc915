"""The blocking facade's streams and interrupted calls, against a real server in a thread:
a stream is read one result at a time and stopping to read it stops the server's handler;
a caller interrupted while it waits (KeyboardInterrupt) cancels its call."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rpc
from rpc import loops

LIVE = 10
"""Results the endless handler yields before it waits (for ever) for more to make."""


class Feeds:
    """An endless streaming handler per name; ``ended[name]`` is set once it stopped."""

    def __init__(self) -> None:
        self.ended: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.registry = rpc.Registry()

        @self.registry.handle("feed")
        async def feed(name: str) -> Any:
            try:
                for n in range(LIVE):
                    yield n
                self.started[name].set()
                await asyncio.get_running_loop().create_future()  # a subscription: no end
            finally:
                self.ended[name].set()

        @self.registry.handle("echo")
        def echo(value: Any) -> Any:
            return value

        @self.registry.handle("hang")
        async def hang(name: str) -> None:
            try:
                self.started[name].set()
                await asyncio.get_running_loop().create_future()
            finally:
                self.ended[name].set()

    def expect(self, name: str) -> tuple[threading.Event, threading.Event]:
        self.started[name], self.ended[name] = threading.Event(), threading.Event()
        return self.started[name], self.ended[name]


@contextlib.contextmanager
def serving(registry: rpc.Registry) -> Iterator[str]:
    """A server on its own loop thread (the blocking client has the shared one); its URL."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = stop = asyncio.Event()
        async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) as server:
            state["url"] = str(server.url)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loops.run, args=(main(),))
    thread.start()
    assert ready.wait(10)
    try:
        yield state["url"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)
    assert not thread.is_alive()


def test_breaking_out_of_an_endless_stream_returns_and_stops_the_handler() -> None:
    feeds = Feeds()
    _, ended = feeds.expect("a")
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        done = threading.Event()
        got: list[int] = []

        def read() -> None:  # in a thread: a call that never returns fails the test below
            for n in peer.stream("feed", value="a", item_timeout=60):
                got.append(n)
                if len(got) == 3:
                    break
            done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(10), "stream() never returned"
        assert got == [0, 1, 2]
        assert ended.wait(5), "the server's handler still runs"
        assert peer.request("echo", "after") == "after"  # the connection lives on


def test_closed_or_dropped_stream_stops_the_handler() -> None:
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        _, ended = feeds.expect("closed")
        with peer.stream("feed", value="closed", item_timeout=60) as results:
            assert [next(results), next(results)] == [0, 1]
        assert ended.wait(5)
        assert list(results) == []  # closed: nothing more

        _, ended = feeds.expect("dropped")
        results = peer.stream("feed", value="dropped", item_timeout=60)
        assert next(results) == 0
        del results  # never exhausted nor closed
        assert ended.wait(5)

        with pytest.raises(rpc.RemoteError, match="unknown operation"):
            peer.stream("missing")  # the call waits for the first result: errors raise here


def test_stream_closed_by_another_thread_ends_a_waiting_next() -> None:
    feeds = Feeds()
    started, ended = feeds.expect("t")
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        results = peer.stream("feed", value="t", item_timeout=60)
        rest: list[list[int]] = []
        reader = threading.Thread(target=lambda: rest.append(list(results)))
        reader.start()
        assert started.wait(5)  # all LIVE results sent; the reader waits for one more
        results.close()
        reader.join(5)
        assert not reader.is_alive()  # its wait for a result ended with the close
        assert rest == [list(range(len(rest[0])))]
        assert ended.wait(5)


@contextlib.contextmanager
def interrupt_when(ready: Callable[[], bool]) -> Iterator[None]:
    """SIGINT to this (the main) thread once ``ready()`` holds (polled every 5 ms, for 10 s
    at most): a KeyboardInterrupt in the wait of the blocking call made in the block."""
    main = threading.main_thread()
    assert threading.current_thread() is main
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    leave = threading.Event()

    def fire() -> None:
        deadline = time.monotonic() + 10
        while not ready():
            if leave.wait(0.005) or time.monotonic() > deadline:
                return
        signal.pthread_kill(main.ident or 0, signal.SIGINT)

    thread = threading.Thread(target=fire)
    thread.start()
    try:
        yield
    finally:
        leave.set()
        thread.join(15)
        signal.signal(signal.SIGINT, previous)


def test_interrupted_blocking_calls_are_cancelled() -> None:
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        started, ended = feeds.expect("request")
        # the handler runs: the caller waits for its result
        with interrupt_when(started.is_set), pytest.raises(KeyboardInterrupt):
            peer.request("hang", "request", timeout=60)
        assert ended.wait(5), "the interrupted request goes on in the background"

        _, ended = feeds.expect("stream")
        results = peer.stream("feed", value="stream", item_timeout=60)
        # a next() waits for a result from the loop (the handler stops after LIVE of them)
        with interrupt_when(lambda: results._fetch is not None), pytest.raises(KeyboardInterrupt):
            for _ in results:
                pass
        assert ended.wait(5), "the interrupted stream goes on in the background"
        assert list(results) == []
        assert peer.request("echo", "after") == "after"

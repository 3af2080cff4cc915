"""The blocking facade's streams and interrupted calls, against a real server in a thread:
a stream's results are buffered for its reader as they come (up to ``max_buffered``), and
stopping to read it stops the server's handler; a caller interrupted while it waits
(KeyboardInterrupt) cancels its call."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

import pytest

import rpc
from tests.rpc_helpers import served_on_thread

LIVE = 10
"""Results the endless handler yields before it waits (for ever) for more to make."""

BATCH = 100
"""Results the ``batches`` handler sends at a time: fewer than max_stream_queue (256)."""


class Feeds:
    """The server's handlers; ``ended[name]`` is set once the one streaming to ``name``
    stopped."""

    def __init__(self) -> None:
        self.ended: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.ticks: dict[str, asyncio.Event] = {}  # on the server's loop
        self.batch: dict[str, asyncio.Event] = {}  # on the server's loop
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

        @self.registry.handle("count")
        async def count(n: int) -> Any:
            for i in range(n):
                yield i

        @self.registry.handle("batches")
        async def batches(n: int) -> Any:
            """``n`` results in batches of BATCH, each once ``more`` is called (the first at
            once): a stream paced so that no read of ours holds more than a batch or two,
            whose results reach us whether we read them or not."""
            sent, go = self.events("sent"), self.events("go")
            try:
                for start in range(0, n, BATCH):
                    for i in range(start, min(n, start + BATCH)):
                        yield i
                    sent.set()
                    await go.wait()
                    go.clear()
            finally:  # stopped (or cancelled): more waits for it no more
                self.events("over").set()
                sent.set()

        @self.registry.handle("more")
        async def more(_: Any) -> None:
            """Once the batch under way is sent (its results go before this answer), the
            next may go."""
            sent = self.events("sent")
            await sent.wait()
            if not self.events("over").is_set():
                sent.clear()
            self.events("go").set()

        @self.registry.handle("flood")
        async def flood(name: str) -> Any:
            try:
                for n in itertools.count():
                    yield n
                    await asyncio.sleep(0)  # a producer that awaits: the server reads meanwhile
            finally:
                self.ended[name].set()

        @self.registry.handle("ticks")
        async def ticks(name: str) -> Any:
            """A result each time ``tick`` is called with ``name``."""
            tick = self.ticks.setdefault(name, asyncio.Event())
            try:
                for n in itertools.count():
                    await tick.wait()
                    tick.clear()
                    yield n
            finally:
                self.ended[name].set()

        @self.registry.handle("tick")
        async def tick(name: str) -> None:
            self.ticks.setdefault(name, asyncio.Event()).set()

    def events(self, name: str) -> asyncio.Event:
        """An event of the ``batches`` handler (made on the server's loop)."""
        return self.batch.setdefault(name, asyncio.Event())

    def expect(self, name: str) -> tuple[threading.Event, threading.Event]:
        self.started[name], self.ended[name] = threading.Event(), threading.Event()
        return self.started[name], self.ended[name]


@contextlib.contextmanager
def serving(registry: rpc.Registry) -> Iterator[str]:
    """A server on its own loop thread (the blocking client has the shared one); its URL."""
    with served_on_thread(registry) as (url, _, _):
        yield url


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


def test_a_reader_slower_than_the_server_gets_every_result() -> None:
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        results = peer.stream("batches", value=2_000)
        # every batch is sent and comes in (an answer of more follows its batch), none of
        # them read yet: 2,000 results, far past max_stream_queue (256) unread
        for _ in range(2_000 // BATCH):
            peer.request("more")
        assert list(results) == list(range(2_000))


def test_threads_reading_one_stream_share_its_results() -> None:
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        results = peer.stream("count", value=200)
        got: list[list[int]] = [[], []]
        readers = [threading.Thread(target=mine.extend, args=(results,)) for mine in got]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(10)
        assert not any(reader.is_alive() for reader in readers)
        assert sorted(got[0] + got[1]) == list(range(200))
        assert all(mine == sorted(mine) for mine in got)


def test_a_reader_slower_than_the_server_past_max_buffered_gets_every_result() -> None:
    """A reader that falls more than ``max_buffered`` (100) results behind a server that
    sends as fast as it can: the stream waits for it (the pump, then the connection stop
    taking results) and it gets them all. Before, the stream failed with StreamOverflow."""
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        got = []
        for item in peer.stream("count", value=5_000, max_buffered=100):
            got.append(item)
            if len(got) % 1_000 == 0:
                time.sleep(0.05)  # a slow reader now and then (load, not synchronisation)
        assert got == list(range(5_000))
        assert peer.request("echo", "after") == "after"


def test_a_slow_but_steady_reader_past_max_buffered_outlasts_its_item_timeout() -> None:
    """A thread that takes a result every 10 ms from a stream 64 results ahead of it in its
    buffer and 16 in the connection's queue, with an ``item_timeout`` of 0.2 s: it never
    goes 0.2 s without taking one, so it gets every result. Before, the pump waited for
    half the buffer to be taken (0.32 s) and the connection failed the stream meanwhile."""
    feeds = Feeds()
    options = rpc.Options(max_stream_queue=16)
    with (
        serving(feeds.registry) as url,
        rpc.blocking.connect(url, reconnect=False, options=options) as peer,
    ):
        got = []
        for item in peer.stream("count", value=150, max_buffered=64, item_timeout=0.2):
            got.append(item)
            time.sleep(0.01)  # a slow reader (its pace, not a synchronisation)
        assert got == list(range(150))


def test_a_stream_whose_reader_stops_fails_at_its_item_timeout() -> None:
    """Nothing read: the pump holds ``max_buffered`` (100) results, the connection's queue
    of the stream 256 more, and the connection stops reading; at the stream's
    ``item_timeout`` (0.5 s) the stream fails alone and the server's handler is stopped.
    The reader then gets the results before the error, the error, and nothing more."""
    feeds = Feeds()
    _, ended = feeds.expect("f")
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        results = peer.stream("flood", value="f", max_buffered=100, item_timeout=0.5)
        assert ended.wait(5), "the server's handler still runs"  # nothing read meanwhile
        got: list[int] = []
        with pytest.raises(
            rpc.StreamOverflow, match=r"256 stream results waiting, none taken for 0\.5 s"
        ):
            got.extend(results)
        assert got == list(range(100 + 256))  # the results before it come first
        assert list(results) == []
        assert peer.request("echo", "after") == "after"  # the connection lives on
        with pytest.raises(ValueError, match="max_buffered"):
            peer.stream("flood", value="f", max_buffered=0)


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

        started, ended = feeds.expect("first")
        # stream() waits for the first result, which does not come
        with interrupt_when(started.is_set), pytest.raises(KeyboardInterrupt):
            peer.stream("hang", value="first", item_timeout=60)
        assert ended.wait(5), "the interrupted stream goes on in the background"

        _, ended = feeds.expect("stream")
        results = peer.stream("feed", value="stream", item_timeout=60)
        got: list[int] = []

        # the reader has every result the handler sends (LIVE) and its next() waits for more
        def ready() -> bool:
            return len(got) == LIVE and results.waiting > 0

        with interrupt_when(ready), pytest.raises(KeyboardInterrupt):
            got.extend(results)
        assert ended.wait(5), "the interrupted stream goes on in the background"
        assert list(results) == []
        assert peer.request("echo", "after") == "after"


def interrupt_under(code: CodeType, n: int) -> Callable[[FrameType, str, Any], Any]:
    """A trace function for this thread that raises KeyboardInterrupt once, at the ``n``-th
    start or return of a Python function called (at any depth) by a run of ``code``: where
    the handler of a signal such as SIGINT may run too, as a function starts and as a call
    returns."""
    events = itertools.count(1)
    under = False

    def event(frame: FrameType, kind: str, arg: Any) -> Any:
        if kind in ("call", "return") and next(events) == n:
            raise KeyboardInterrupt
        return event

    def leave(frame: FrameType, kind: str, arg: Any) -> Any:
        nonlocal under
        under = kind != "return"
        return leave

    def calls(frame: FrameType, kind: str, arg: Any) -> Any:
        nonlocal under
        frame.f_trace_lines = False
        if frame.f_code is code:
            under = True
            return leave
        return event(frame, kind, arg) if under else None

    return calls


def tick_once_waiting(
    peer: Any, results: Any, name: str, leave: threading.Event, ticked: threading.Event
) -> None:
    """Have the ``ticks`` handler ``name`` send a result once a next() of ``results`` waits
    (polled every 5 ms until ``leave`` is set)."""
    while not leave.wait(0.005):
        if results.waiting:
            peer.request("tick", name)
            ticked.set()
            return


def test_an_interrupt_anywhere_in_next_stops_the_stream_or_changes_nothing() -> None:
    """A KeyboardInterrupt at each point of a next() where a signal's handler may run (a
    Python function under it starts or returns), in turn; with a result there already and
    with one that comes while it waits (a real SIGINT in the wait: the test above). Either
    the stream stops (its handler is cancelled, with the iterator still referenced, and it
    reads as ended), or, interrupted before it did anything, it is as it was (the same next
    result); never a reader still busy, nor a result lost."""
    feeds = Feeds()
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as peer:
        for waits in (False, True):
            for n in range(1, 200):
                name = f"{waits}-{n}"
                _, ended = feeds.expect(name)
                if waits:
                    peer.request("tick", name)  # its first result
                results = peer.stream("ticks" if waits else "feed", value=name, item_timeout=10)
                assert next(results) == 0
                leave, ticked = threading.Event(), threading.Event()
                ticker = threading.Thread(
                    target=tick_once_waiting, args=(peer, results, name, leave, ticked)
                )
                if waits:  # the next result comes once next() waits
                    ticker.start()
                else:  # every result is there already (the echo is answered after them)
                    assert feeds.started[name].wait(5)
                    assert peer.request("echo", name) == name
                previous = sys.gettrace()
                sys.settrace(interrupt_under(type(results).__next__.__code__, n))
                try:
                    item = next(results)
                except KeyboardInterrupt:
                    item = None
                finally:
                    sys.settrace(previous)
                    leave.set()
                    if waits:
                        ticker.join(10)
                if item is not None:  # next() ran fewer than n lines: all were tried
                    assert item == 1
                    results.close()
                    assert ended.wait(5)
                    break
                if waits and not ticked.is_set():
                    peer.request("tick", name)  # interrupted before it waited: its result
                after = next(results, None)
                if after is not None:  # interrupted before it did anything
                    assert after == 1, f"point {n}: a result lost"
                    results.close()
                assert ended.wait(5), f"point {n}: the interrupted stream goes on"
                assert list(results) == [], f"point {n}"
            else:
                raise AssertionError("next() never ran to its end")

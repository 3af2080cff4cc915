"""Blocking calls made on rpc.blocking's own background loop thread: in a handler a
blocking client serves, or in its ``on_connect`` callback. Such a call would wait for the
loop it stops; it raises ``rpc.blocking.CalledOnLoopThread`` (a RuntimeError) instead.
Before, a blocking stream's ``next()`` there waited for good (and with it every blocking
client of the process), and a request raised a bare RuntimeError.

The server runs on a loop of its own thread (tests.test_blocking_stream.serving); the
blocking clients on the shared background loop (uvloop with ``--loop uvloop``). Every wait
is bounded: a deadlocked loop fails the test, which then frees it by closing the stream.
"""

from __future__ import annotations

import threading
from typing import Any

import rpc
from rpc.blocking import CalledOnLoopThread
from tests.reconnect_helpers import FAST
from tests.test_blocking_stream import LIVE, Feeds, serving

WAIT = 10.0
"""Seconds a step may take before the test calls it a deadlock."""


def outcome(call: Any) -> Any:
    """What ``call()`` did: its result, or its error's type."""
    try:
        return call()
    except BaseException as exc:  # the test compares what happened
        return type(exc)


def test_next_and_request_in_a_handler_served_on_the_loop_raise() -> None:
    """A handler of the blocking client's registry runs on the background loop's thread;
    there, ``next()`` of a stream with nothing buffered and a blocking request raise
    CalledOnLoopThread, and the stream goes on for a reader on another thread."""
    feeds = Feeds()
    started, ended = feeds.expect("f")

    @feeds.registry.handle("call_back")
    async def call_back(op: str) -> Any:  # on the server: calls the client's handler
        return await rpc.current_peer.get().request(op)

    seen: dict[str, Any] = {}
    client = rpc.Registry()
    with serving(feeds.registry) as url:
        reader = rpc.blocking.connect(url, reconnect=False)
        results = reader.stream("feed", value="f", item_timeout=60)

        @client.handle("poke")
        async def poke(_: Any) -> str:  # on the background loop's thread
            seen["next"] = outcome(lambda: next(results))
            seen["request"] = outcome(lambda: reader.request("echo", 1))
            return "poked"

        caller = rpc.blocking.connect(url, reconnect=False, registry=client)
        try:
            assert [next(results) for _ in range(LIVE)] == list(range(LIVE))
            assert started.wait(WAIT)  # all sent: the buffer stays empty from now on
            answered: list[Any] = []
            thread = threading.Thread(
                target=lambda: answered.append(caller.request("call_back", "poke")),
                daemon=True,
            )
            thread.start()
            thread.join(WAIT)
            assert not thread.is_alive(), f"the loop deadlocked ({seen})"
            assert answered == ["poked"]
            assert seen == {"next": CalledOnLoopThread, "request": CalledOnLoopThread}
            assert not ended.is_set()  # the stream was left as it was
            assert reader.request("echo", "after") == "after"
        finally:
            results.close()  # first: frees a loop stuck in next() (the old code)
            caller.close()
            reader.close()
        assert ended.wait(WAIT)


def test_blocking_calls_in_on_connect_raise() -> None:
    """``on_connect`` runs on the background loop's thread: a blocking request, stream or
    close there raises CalledOnLoopThread, a RuntimeError, and the connect goes on."""
    feeds = Feeds()
    seen: dict[str, Any] = {}
    errors: list[BaseException] = []
    with serving(feeds.registry) as url, rpc.blocking.connect(url, reconnect=False) as other:

        def on_connect(_peer: rpc.Peer) -> None:
            seen["request"] = outcome(lambda: other.request("echo", 1))
            seen["stream"] = outcome(lambda: other.stream("count", value=3))
            seen["close"] = outcome(other.close)
            try:
                other.request("echo", 2)
            except RuntimeError as exc:  # code that caught the RuntimeError still does
                errors.append(exc)

        connected: list[rpc.blocking.BlockingPeer] = []
        thread = threading.Thread(
            target=lambda: connected.append(
                rpc.blocking.connect(url, reconnect=FAST, on_connect=on_connect)
            ),
            daemon=True,
        )
        thread.start()
        thread.join(WAIT)
        assert not thread.is_alive(), f"the loop deadlocked ({seen})"
        with connected[0] as peer:
            assert peer.request("echo", "ok") == "ok"
        assert seen == dict.fromkeys(("request", "stream", "close"), CalledOnLoopThread)
        assert len(errors) == 1
        assert "background loop's own thread" in str(errors[0])
        assert other.request("echo", "still open") == "still open"

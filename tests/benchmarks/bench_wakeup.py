"""What a wake-up costs the Python code right after it: ``python tests/benchmarks/bench_wakeup.py``.

Not collected by pytest. One request at a time (``bench_rpc.py``'s ``sequential`` mode)
leaves both processes idle between messages, so every message is handled by code that runs
right after its process woke from a wait. This script times the same piece of work three ways
in one run, in this process:

- ``hot``: the piece run back to back, each run timed on its own;
- ``after a syscall``: once after each pair of system calls that do not sleep (``getppid``,
  ``stat``): what entering the kernel alone costs the code after it;
- ``after a wake-up``: once after each blocking read that a partner process (forked here,
  a socket pair between the two) answers at once, which is how a sequential client or
  server runs it.

The pieces are what a server does with one small request besides the socket calls, from
the cheapest to the dearest: ``bare frame`` (split a 4-byte length-prefixed frame and
build its echo: ``bench_rpc.py``'s bare echo server), ``gotalk`` and ``chatter`` (decode
one request and encode its result with the sans-I/O codecs of :mod:`wire`). Each run takes
a fresh message, so nothing is answered from a cache.

The figures are medians of ``--count`` runs of each (default 20,000; ``--smoke``: 300, CI),
what a wake-up adds to the hot figure, and their ratio. On a machine whose caches and branch
predictors keep their state across a short idle, a wake-up adds next to nothing; where they
do not (virtual machines lose some of that state when a virtual CPU idles and comes back),
it adds more the more code and data a piece touches, so a sequential benchmark measures how
much a request's path touches as much as how fast it runs hot. docs/benchmarks.md reads
these figures next to the sequential rows of ``bench_rpc.py``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wire import gotalk
from wire.chatter import ChatterConnection, Conversation, Dialect

PAYLOAD = b"0123456789abcdef"
Piece = Callable[[], None]


def bare_frame(count: int) -> Piece:
    """Split one length-prefixed frame off a buffer and build its echo."""
    frame = len(PAYLOAD).to_bytes(4, "big") + PAYLOAD
    buf = bytearray()
    out: list[bytes] = []

    def piece() -> None:
        buf.extend(frame)
        size = int.from_bytes(buf[:4], "big")
        body = bytes(buf[4 : 4 + size])
        del buf[: 4 + size]
        out.append(size.to_bytes(4, "big") + body)
        out.clear()

    return piece


def gotalk_piece(count: int) -> Piece:
    """Decode one Gotalk request, encode its result's header and payload."""
    server = gotalk.GotalkConnection()
    server.receive_data(gotalk.VERSION)
    requests = iter(
        [gotalk.encode(gotalk.Request(i.to_bytes(4, "big"), "echo", PAYLOAD)) for i in range(count)]
    )
    result = gotalk.MessageType.RESULT
    out: list[bytes] = []

    def piece() -> None:
        for msg in server.receive_data(next(requests)):
            if isinstance(msg, gotalk.Request):
                out.append(gotalk.id_header(result, msg.id, len(msg.payload)) + msg.payload)
        out.clear()

    return piece


def chatter_piece(count: int) -> Piece:
    """Decode one HatChatter request, encode its result in the conversation."""
    client = ChatterConnection(Dialect.CURRENT, max_conversations=count)  # none answered
    requests = []
    for _ in range(count):
        client.send("echo", PAYLOAD, token=True, last=False)
        requests.append(client.data_to_send())
    server = ChatterConnection(Dialect.CURRENT, max_conversations=count)
    feed = iter(requests)
    out: list[list[bytes]] = []

    def piece() -> None:
        for msg in server.receive_data(next(feed)):
            conversation = Conversation.of_received(msg)
            out.append(server.encode("PeerwireRpc.Result", msg.data, conversation=conversation)[1])
        out.clear()

    return piece


PIECES: dict[str, Callable[[int], Piece]] = {
    "bare frame": bare_frame,
    "gotalk": gotalk_piece,
    "chatter": chatter_piece,
}


def hot(piece: Piece, count: int) -> list[int]:
    clock = time.perf_counter_ns
    times = []
    for _ in range(count):
        start = clock()
        piece()
        times.append(clock() - start)
    return times


def after_syscalls(piece: Piece, count: int) -> list[int]:
    """Each run right after two system calls that return at once (no sleep)."""
    clock = time.perf_counter_ns
    times = []
    for _ in range(count):
        os.getppid()
        os.stat("/")
        start = clock()
        piece()
        times.append(clock() - start)
    return times


def after_wakeups(piece: Piece, count: int, sock: socket.socket) -> list[int]:
    """Each run right after a blocking read the partner answers (the process slept)."""
    clock = time.perf_counter_ns
    times = []
    for _ in range(count):
        sock.send(b"x")
        if sock.recv(1) != b"x":
            raise RuntimeError("the partner process went away")
        start = clock()
        piece()
        times.append(clock() - start)
    return times


def partner(sock: socket.socket) -> None:
    """Answer every byte at once, until the other end closes."""
    while sock.recv(1):
        sock.send(b"x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000, help="runs of each piece, each way")
    parser.add_argument("--smoke", action="store_true", help="300 runs (CI)")
    args = parser.parse_args()
    count = 300 if args.smoke else args.count
    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:  # the partner: nothing but blocking reads and writes
        status = 1
        try:
            ours.close()
            partner(theirs)
            status = 0
        finally:
            os._exit(status)  # never back into the parent's code
    theirs.close()
    try:
        print(f"{count:,} runs of each piece, medians (microseconds)")
        print(
            f"{'piece':<12}{'hot':>9}{'after a syscall':>17}{'after a wake-up':>17}"
            f"{'wake-up adds':>14}{'ratio':>7}"
        )
        for name, make in PIECES.items():
            hot(make(1000), 1000)  # first calls: imports, caches, specialisation
            hot_us = statistics.median(hot(make(count), count)) / 1000
            syscall_us = statistics.median(after_syscalls(make(count), count)) / 1000
            woken_us = statistics.median(after_wakeups(make(count), count, ours)) / 1000
            print(
                f"{name:<12}{hot_us:>6.2f} us{syscall_us:>14.2f} us{woken_us:>14.2f} us"
                f"{woken_us - hot_us:>11.2f} us{woken_us / hot_us:>6.1f}x"
            )
    finally:
        ours.close()
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()

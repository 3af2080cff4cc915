"""The RPC core's server-side CPU per request, without sockets:
``python tests/benchmarks/bench_core.py [--smoke] [--requests N] [--repeat R]``.

Not collected by pytest. ``bench_rpc.py`` measures whole round trips between processes, and
on a shared machine its rates spread too much to see a change of a few percent. This one
feeds a server :class:`~rpc.peer.Peer` pre-encoded requests in reads of 100, as a transport
would deliver a burst, and counts the process CPU until every reply has been written to a
stand-in transport that only keeps a byte count. No socket, no other process: what is left
is the core (adapter, dispatch, handler call, reply, outbox) plus the codec. The baseline,
measured in the same run, is the codec alone on the same messages (the server's decode and
the encode of its replies), so the difference is what the core adds per request.

Rows: Gotalk and Chatter (``HatChatter``), each with a plain function handler, a coroutine
handler, a coroutine handler that waits once (``coro, waits``: ``await asyncio.sleep(0)``,
so it holds a worker task of its own until it answers) and a plain handler behind one
pass-through middleware; for Gotalk also the
coroutine handler called by a peerwire client that chose a timeout (``coro, timed``: each
request preceded by its metadata, the handler bounded by the caller's deadline; "core
adds" there includes decoding the metadata notification) and by one that announced that
timeout as the connection's default (``timed, default``, extension level 3: the requests go
alone).

The client side, Gotalk and Chatter: 100 worker tasks each make one ``request(...,
raw=True)`` at a time on a client peer, as ``bench_rpc.py``'s inflight100 does, and each
read of 100 pre-encoded results answers one request of each. Its baselines, in the same run: the
codec's share (each request's header, the results' decode) and the floor any asyncio
client pays, a future per call resolved and its worker woken (``client futures``); the
core adds what is left over both. Each figure is the best of
``--repeat`` runs (default 5) of ``--requests`` requests (default 20,000); ``--smoke`` (CI)
is one run of 1,000. ``--loop uvloop`` runs every row on uvloop (default: asyncio's loop).
``--burst N`` cuts the server rows' requests into reads of N (default 100; 1 is what a
sequential caller sends).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rpc
import rpc.loops
from rpc.chatter_peer import ChatterPeer
from rpc.gotalk_peer import HELLO, META, TIMEOUT, GotalkPeer
from rpc.peer import Peer
from wire import gotalk, metadata
from wire.chatter import ChatterConnection, Conversation, Dialect

PAYLOAD = b"0123456789abcdef"
BURST = 100


class CountingTransport(asyncio.Transport):
    """Takes what the peer writes and keeps only its length."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.chunks: list[bytes] = []
        self.keep = False

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self.keep:
            self.chunks.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def _pass_through(call: rpc.Call, call_next: Callable[[rpc.Call], Awaitable[Any]]) -> Any:
    return await call_next(call)


def registry(kind: str) -> rpc.Registry:
    reg = rpc.Registry()
    if kind == "middleware":
        reg.use(_pass_through)
    if kind == "coroutine":

        @reg.handle("echo")
        async def async_echo(data: bytes) -> bytes:
            return data

    elif kind == "waits":

        @reg.handle("echo")
        async def waiting_echo(data: bytes) -> bytes:
            await asyncio.sleep(0)  # waits once: a task of its own until it answers
            return data

    else:

        @reg.handle("echo")
        def echo(data: bytes) -> bytes:
            return data

    return reg


# --- requests as a client sends them, and the codec-only baseline -------------------------


def gotalk_reads(
    count: int, timed: bool = False, burst: int = BURST, default: bool = False
) -> tuple[bytes, list[bytes]]:
    """The client's version, then ``count`` requests cut into reads of ``burst``. ``timed``: a
    peerwire client that chose a timeout (60 s): its hello (extension level 2) goes after
    the version, and each request after its metadata notification; with ``default``, one
    announcement of the timeout after a hello of level 3, and the requests alone."""
    first = gotalk.GotalkConnection().handshake()
    if timed:
        first += gotalk.encode(gotalk.Notification(HELLO, b"3" if default else b"2"))
    if timed and default:
        default_timeout = metadata.encode_timeout_gotalk(60_000)
        first += gotalk.encode(gotalk.Notification(TIMEOUT, default_timeout))
        timed = False  # the requests go alone
    reads = []
    for start in range(0, count, burst):
        parts = []
        for i in range(start, min(count, start + burst)):
            rid = (i + 1).to_bytes(4, "big")
            if timed:
                meta = metadata.encode_gotalk(rid, metadata.RequestMeta(60_000, {}))
                parts.append(gotalk.encode(gotalk.Notification(META, meta)))
            parts.append(gotalk.encode(gotalk.Request(rid, "echo", PAYLOAD)))
        reads.append(b"".join(parts))
    return first, reads


def chatter_reads(count: int, burst: int = BURST) -> tuple[bytes, list[bytes]]:
    """``count`` requests of a HatChatter client (each a conversation of its own, token
    handed over, as peerwire clients send them) cut into reads of ``burst``."""
    client = ChatterConnection(Dialect.CURRENT)
    reads = []
    for start in range(0, count, burst):
        for _ in range(start, min(count, start + burst)):
            client.send("echo", PAYLOAD, token=True, last=False)
        reads.append(client.data_to_send())
    return b"", reads


def codec_gotalk(first: bytes, reads: list[bytes]) -> None:
    conn = gotalk.GotalkConnection()
    conn.receive_data(first)
    for data in reads:
        for msg in conn.receive_data(data):
            gotalk.id_header(gotalk.MessageType.RESULT, msg.id, len(msg.payload))  # the reply


def codec_chatter(first: bytes, reads: list[bytes]) -> None:
    server = ChatterConnection(Dialect.CURRENT)
    for data in reads:
        for msg in server.receive_data(data):
            server.encode("PeerwireRpc.Result", msg.data, conversation=(False, msg.id))


# --- the measurement -----------------------------------------------------------------------


async def serve_all(
    make_peer: Callable[[], Peer], first: bytes, reads: list[bytes], transport: CountingTransport
) -> float:
    """CPU seconds for a new peer to answer every read (its replies all written)."""
    peer = make_peer()
    peer.connection_made(transport)
    if first:
        peer.data_received(first)
    await asyncio.sleep(0)
    base = transport.written
    transport.chunks.clear()  # the greeting, if any
    cpu = time.process_time()
    for data in reads:
        peer.data_received(data)
        while peer.handlers_running:  # coroutine handlers: let them finish
            await asyncio.sleep(0)
    await asyncio.sleep(0)  # a flush scheduled by the last task
    cpu = time.process_time() - cpu
    if transport.written == base:
        raise RuntimeError("the peer wrote no replies")
    peer.connection_lost(None)
    return cpu


def measure(make_peer: Callable[[], Peer], first: bytes, reads: list[bytes]) -> float:
    return rpc.loops.run(serve_all(make_peer, first, reads, CountingTransport()))


def check_replies(
    protocol: str, make_peer: Callable[[], Peer], first: bytes, reads: list[bytes]
) -> int:
    """How many right replies a peer writes for ``reads`` (run before measuring)."""
    transport = CountingTransport()
    transport.keep = True
    rpc.loops.run(serve_all(make_peer, first, reads, transport))
    out = b"".join(transport.chunks)
    if protocol == "gotalk":
        client = gotalk.GotalkConnection()
        client.receive_data(gotalk.GotalkConnection().handshake())
        replies = client.receive_data(out)
        return sum(1 for m in replies if isinstance(m, gotalk.Result) and m.payload == PAYLOAD)
    client_codec = ChatterConnection(Dialect.CURRENT, strict=False)
    return sum(1 for m in client_codec.receive_data(out) if m.data == PAYLOAD)


# --- the client side: 100 callers, each awaiting one request at a time -------------------


def gotalk_results(count: int) -> list[bytes]:
    """The server's version, then the results of ``count`` requests in reads of BURST: read
    k answers the requests a client peer numbers 100k+1..100k+100 (its ids count from 1)."""
    reads = []
    for start in range(0, count, BURST):
        reads.append(
            b"".join(
                gotalk.encode(gotalk.Result((i + 1).to_bytes(4, "little"), PAYLOAD))
                for i in range(start, min(count, start + BURST))
            )
        )
    reads[0] = gotalk.GotalkConnection().handshake() + reads[0]
    return reads


async def call_all(
    call: Callable[[], Awaitable[bytes]], deliver: Callable[[bytes], None], reads: list[bytes]
) -> float:
    """CPU seconds for BURST worker tasks, as ``bench_rpc.py``'s inflight100 runs them, to
    make one call each per read of results and check what they get back."""

    async def worker() -> None:
        for _ in reads:
            if await call() != PAYLOAD:
                raise RuntimeError("wrong result")

    cpu = time.process_time()
    workers = [asyncio.ensure_future(worker()) for _ in range(BURST)]
    await asyncio.sleep(0)  # every worker sends its first request
    for data in reads:
        deliver(data)  # the workers wake up after this task's sleep: take it, send the next
        await asyncio.sleep(0)
    await asyncio.gather(*workers)
    return time.process_time() - cpu


async def client_calls(make_peer: Callable[[], Peer], reads: list[bytes]) -> float:
    """:func:`call_all` with a client peer's ``request(..., raw=True)`` (made in the loop)."""
    peer = make_peer()
    peer.connection_made(CountingTransport())

    def call() -> Awaitable[bytes]:
        return peer.request("echo", PAYLOAD, raw=True)  # type: ignore[no-any-return]

    try:
        return await call_all(call, peer.data_received, reads)
    finally:
        peer.connection_lost(None)


def chatter_results(count: int) -> list[bytes]:
    """The results of ``count`` requests of a HatChatter client peer in reads of BURST: read
    k answers the conversations it opens with messages 100k+1..100k+100."""
    server = ChatterConnection(Dialect.CURRENT, strict=False)
    reads = []
    for start in range(0, count, BURST):
        for i in range(start, min(count, start + BURST)):
            server.send("PeerwireRpc.Result", PAYLOAD, conversation=Conversation(False, i + 1))
        reads.append(server.data_to_send())
    return reads


def codec_chatter_client(reads: list[bytes]) -> None:
    """The client's codec work: each request's frame, the results' decode."""
    conn = ChatterConnection(Dialect.CURRENT, strict=False)
    for data in reads:
        for _ in range(BURST):
            conn.encode("echo", PAYLOAD, token=True, last=False)
        conn.receive_data(data)


async def futures_client(reads: list[bytes]) -> float:
    """The floor: a future per call, all resolved per read (what any asyncio client pays
    to wake its callers; ``bench_rpc.py``'s bare echo client does this plus framing)."""
    waiting: list[asyncio.Future[bytes]] = []
    loop = asyncio.get_running_loop()

    def call() -> Awaitable[bytes]:
        future: asyncio.Future[bytes] = loop.create_future()
        waiting.append(future)
        return future

    def deliver(data: bytes) -> None:
        for future in waiting:
            future.set_result(PAYLOAD)
        waiting.clear()

    return await call_all(call, deliver, reads)


def codec_gotalk_client(reads: list[bytes]) -> None:
    """The client's codec work: each request's header, the results' decode."""
    conn = gotalk.GotalkConnection()
    request, next_id = gotalk.MessageType.REQUEST, 0
    for data in reads:
        for _ in range(BURST):
            next_id += 1
            gotalk.request_header(request, next_id.to_bytes(4, "little"), "echo", len(PAYLOAD))
        conn.receive_data(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one run of 1,000 requests (CI)")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument(
        "--burst", type=int, default=BURST, help="requests per read, server rows (default 100)"
    )
    args = parser.parse_args()
    os.environ[rpc.loops.ENV_VAR] = args.loop  # what rpc.loops.run runs every row on
    count, repeat = (1_000, 1) if args.smoke else (args.requests, args.repeat)

    protocols: dict[str, tuple[Any, Callable[..., tuple[bytes, list[bytes]]], Any]] = {
        "gotalk": (lambda reg: GotalkPeer(reg), gotalk_reads, codec_gotalk),
        "chatter": (
            lambda reg: ChatterPeer(reg, dialect=None),
            chatter_reads,
            codec_chatter,
        ),
    }
    print(
        f"{count:,} requests of {len(PAYLOAD)} bytes in reads of {args.burst} (client rows:"
        f" {BURST}), best of {repeat}, "
        f"on {args.loop}"
    )
    rows: list[tuple[str, str, Callable[[], float]]] = []
    for name, (peer_of, reads_of, codec_only) in protocols.items():
        first, reads = reads_of(count, burst=args.burst)
        rows.append((name, "codec alone", lambda f=first, r=reads, c=codec_only: _cpu(c, f, r)))
        kinds = (("plain", "plain"), ("coroutine", "coroutine"), ("coro, waits", "waits"))
        cases = [(kind, handlers, first, reads) for kind, handlers in kinds]
        cases.append(("middleware", "middleware", first, reads))
        if name == "gotalk":  # a coroutine handler called with a timeout: bounded by it
            timed = gotalk_reads(count, timed=True, burst=args.burst)
            cases.append(("coro, timed", "coroutine", *timed))
            by_default = gotalk_reads(count, timed=True, burst=args.burst, default=True)
            cases.append(("timed, default", "coroutine", *by_default))
        for kind, handlers, case_first, case_reads in cases:
            reg = registry(handlers)

            def make(reg: rpc.Registry = reg, peer_of: Any = peer_of) -> Peer:
                return peer_of(reg)  # type: ignore[no-any-return]

            answered = check_replies(name, make, case_first, case_reads)
            if answered != count:
                raise RuntimeError(f"{name} {kind}: {answered} of {count} replies")
            rows.append((name, kind, lambda m=make, f=case_first, r=case_reads: measure(m, f, r)))
    clients: dict[str, tuple[Any, Any, Callable[[int], list[bytes]]]] = {
        "gotalk": (codec_gotalk_client, lambda: GotalkPeer(rpc.Registry()), gotalk_results),
        "chatter": (
            codec_chatter_client,
            lambda: ChatterPeer(rpc.Registry(), dialect=Dialect.CURRENT),
            chatter_results,
        ),
    }
    for name, (codec_only, client, results_of) in clients.items():
        results = results_of(count)
        rows.append(
            (
                name,
                "client codec",
                lambda c=codec_only, r=results: _cpu(c, r),
            )
        )
        rows.append((name, "client futures", lambda r=results: rpc.loops.run(futures_client(r))))
        rows.append(
            (name, "client request", lambda c=client, r=results: rpc.loops.run(client_calls(c, r)))
        )
    best: dict[tuple[str, str], float] = {}
    for _ in range(repeat):  # rows interleaved, so that the machine's drift hits them all
        for name, kind, run in rows:
            seconds = run()
            best[name, kind] = min(seconds, best.get((name, kind), seconds))
    print(f"{'protocol':<9}{'side, handler':<16}{'per request':>12}{'core adds':>11}")
    for name, kind, _ in rows:
        per = best[name, kind] / count * 1e6
        if kind.startswith("client"):  # over the codec and the floor of waking a caller
            base = best[name, "client codec"] + best[name, "client futures"]
        else:
            base = best[name, "codec alone"]
        adds = per - base / count * 1e6
        baselines = ("codec alone", "client codec", "client futures")
        extra = "" if kind in baselines else f"{adds:8.2f} us"
        print(f"{name:<9}{kind:<16}{per:9.2f} us{extra}")


def _cpu(fn: Callable[..., None], *args: Any) -> float:
    """Process CPU seconds of ``fn(*args)``."""
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


if __name__ == "__main__":
    main()

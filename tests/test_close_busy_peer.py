"""A graceful close against a busy peer that takes no retry results (plain Gotalk clients,
hat-drivers' Chatter client, gotalk.js): what that peer sends once the close began, with
no call of ours in flight, is dropped unrun, so the close ends once the requests read
before it have been answered, not at ``drain_timeout`` (5 s). Before 12d3f81, each request
the peer sent during the drain was run and waited for, round after round: a client that
replaces each answered request with a new one held every close to the full drain, then had
its requests in flight cut. The requests dropped never run (the handler counts its calls),
and fail on the client as the connection closes; the closing handshakes of TLS and
WebSocket still complete, and over TCP the client gets our FIN behind its answers, not a
reset (the server reads on until the client's FIN, or a pause of its input). A peer that
takes retry results still gets them ("closing"), as before."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

import pytest
from hat.drivers import chatter as hat_chatter
from hat.drivers import net
from prometheus_client import CollectorRegistry

import rpc
import rpc.closing
from rpc.metrics import Metrics
from tests.certs import Pki
from tests.rpc_helpers import wait_until
from transports.stream import client_ssl_context, server_ssl_context

pytestmark = pytest.mark.both_loops

IN_FLIGHT = 8
"""Requests each busy client keeps in flight: each answered one is replaced at once."""
WARM = 40
"""Answers a client has before the close begins."""
PROMPT = 0.5
"""A close with nothing but the requests read before it to wait for ends well within this
(handlers of 1-7 ms); before, it took the whole ``drain_timeout``, 5 s."""
BOUND = 1.5
"""How long the test waits for the close at most (on the defect it would take 5 s)."""


class Work:
    """The server's ``work`` handler: it records the requests it runs, read before their
    connection's close began (``ran``) or after (``late``). By the time of their read, not
    of their run: a request read before may wait in the connection's backlog (our output
    to a loaded client backed up) and run after the close began, as it should."""

    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.late: list[Any] = []
        self.closed_at: float | None = None
        """Loop time at which the close began (:meth:`close`)."""
        self.hold: asyncio.Event | None = None
        """Set: the request of value -1 waits for it."""

    def registry(self) -> rpc.Registry:
        reg = rpc.Registry()

        async def finish(value: Any) -> Any:
            # 1-7 ms: work in flight when the close begins, its answers staggered (the
            # client's next requests come while others run, as from a busy client)
            await asyncio.sleep(0.001 * (1 + abs(value) % 7))
            if value == -1 and self.hold is not None:
                await self.hold.wait()
            return value

        @reg.handle("work")
        def work(value: Any) -> Any:  # called as the request is dispatched, once read
            began = self.closed_at
            late = began is not None and rpc.current_peer.get().read_at > began
            (self.late if late else self.ran).append(value)
            return finish(value)

        return reg

    async def close(self, server: rpc.Server) -> float:
        """Close ``server``'s one connection gracefully (default ``drain_timeout``, 5 s),
        then the server: the seconds it took. The connection's ``close()`` is awaited in
        this task, so that it begins at ``closed_at`` (``Server.close`` starts it in a task
        of its own, a loop turn later, after that turn's reads)."""
        loop = asyncio.get_running_loop()
        [peer] = server.peers
        self.closed_at = started = loop.time()
        async with asyncio.timeout(BOUND):
            await peer.close()
            await server.close()
        return loop.time() - started


class GotalkBusy:
    """A plain Gotalk v1 client on a socket (no peerwire extension, no retry results):
    ``IN_FLIGHT`` requests of ``work``, each answered one followed by a new one."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, closes: bool = True
    ) -> None:
        self.reader, self.writer = reader, writer
        self.closes = closes
        """Whether it closes its socket once the server's is closed (else its owner does)."""
        self.answered: set[int] = set()
        self.warm = asyncio.Event()
        self.ended = ""
        self._next = 0

    def _send(self) -> None:
        value = str(self._next).encode()
        rid = self._next.to_bytes(4, "little")
        self._next += 1
        self.writer.write(b"r" + rid + b"004work" + b"%08x" % len(value) + value)

    def _parse(self, buf: bytes) -> bytes:
        while buf:
            kind = buf[:1]
            if kind == b"h":  # a heartbeat: load and time
                if len(buf) < 13:
                    return buf
                buf = buf[13:]
                continue
            if kind not in (b"R", b"E") or len(buf) < 13:
                if kind not in (b"R", b"E"):
                    raise AssertionError(f"unexpected {buf[:40]!r}")
                return buf
            size = int(buf[5:13], 16)
            if len(buf) < 13 + size:
                return buf
            assert kind == b"R", buf[: 13 + size]
            self.answered.add(int(buf[13 : 13 + size]))
            buf = buf[13 + size :]
            if len(self.answered) >= WARM:
                self.warm.set()
            self._send()
        return buf

    async def run(self) -> None:
        self.writer.write(b"01")
        try:
            assert await self.reader.readexactly(2) == b"01"
            for _ in range(IN_FLIGHT):
                self._send()
            buf = b""
            while True:
                data = await self.reader.read(65536)
                if not data:
                    self.ended = "EOF"
                    return
                buf = self._parse(buf + data)
        except (ConnectionError, ssl.SSLError) as exc:
            self.ended = repr(exc)
        finally:
            if self.closes:
                await self.close()

    async def close(self) -> None:
        self.writer.close()  # (over TLS: our close_notify, the server's close ends)
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()


def _check(work: Work, answered: set[Any], took: float) -> None:
    assert took < PROMPT, f"the close took {took:.3f} s"
    assert len(work.ran) >= WARM
    assert work.late == []  # read after the close began: never run
    assert set(work.ran) <= answered  # read before it: all answered
    assert len(work.ran) - len(answered) <= IN_FLIGHT


async def _gotalk_busy_close(
    url: str, work: Work, metrics: Metrics | None = None, **tls: Any
) -> tuple[float, str, Any]:
    ssl_server = tls.pop("server", None)
    async with rpc.serve(
        url, registry=work.registry(), retry_results=False, ssl=ssl_server, metrics=metrics
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port, **tls)
        client = GotalkBusy(reader, writer)
        running = asyncio.ensure_future(client.run())
        await asyncio.wait_for(client.warm.wait(), 5)
        [served] = server.peers
        took = await work.close(server)
        await asyncio.wait_for(running, 5)
    _check(work, client.answered, took)
    return took, client.ended, served.closed.result()


async def test_a_busy_gotalk_client_does_not_hold_the_close() -> None:
    """Over TCP: the client sees the socket close (EOF), its answers all read first."""
    work = Work()
    _, ended, _ = await _gotalk_busy_close("tcp+gotalk://127.0.0.1:0", work)
    assert ended == "EOF"


async def test_a_server_with_metrics_half_closes_too() -> None:
    """Metrics wrap the server's transport: it half-closes as the plain one does (it said
    it could not, so such a server closed with the client's input unread, and the client
    could get a reset instead of its last answers and EOF)."""
    work = Work()
    registry = CollectorRegistry()
    _, ended, _ = await _gotalk_busy_close("tcp+gotalk://127.0.0.1:0", work, Metrics(registry))
    assert ended == "EOF"
    sent = registry.get_sample_value("peerwire_sent_bytes_total", {"protocol": "gotalk"})
    assert sent, sent  # the answers went through the metered transport


async def test_a_client_that_does_not_close_on_eof_is_not_waited_for() -> None:
    """Over TCP the server half-closes and reads on, so that what the client still sends
    does not reset the connection; a client that reads our EOF but keeps its side open
    holds the close only until its input has paused ``rpc.closing.QUIET`` (0.5 s), not
    for the whole linger (5 s)."""
    work = Work()
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=work.registry(), retry_results=False
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.url.port)
        client = GotalkBusy(reader, writer, closes=False)
        try:
            running = asyncio.ensure_future(client.run())
            await asyncio.wait_for(client.warm.wait(), 5)
            took = await work.close(server)
            await asyncio.wait_for(running, 5)
            assert client.ended == "EOF" and not writer.is_closing()  # (closed by us below)
        finally:
            await client.close()
    assert rpc.closing.QUIET <= took < rpc.closing.QUIET + PROMPT, took
    assert work.late == [] and set(work.ran) <= client.answered


async def test_a_busy_gotalk_client_over_tls_gets_a_clean_close(pki: Pki) -> None:
    """Over TLS: the server's close_notify reaches the client behind its answers, and the
    client's close_notify ends the server's side (not the TLS shutdown's timeout, nor the
    linger's cut): the requests it sent meanwhile are read and dropped."""
    work = Work()
    _, ended, lost = await _gotalk_busy_close(
        "ssl+gotalk://127.0.0.1:0",
        work,
        server=server_ssl_context(pki.server_cert, pki.server_key),
        ssl=client_ssl_context(cafile=pki.ca),
        server_hostname="localhost",
    )
    assert ended == "EOF", ended
    # the server's side: the client's close_notify, or, on asyncio, OpenSSL's refusal of
    # the requests that crossed our close_notify (it ends the shutdown at once, as well)
    assert lost is None or "APPLICATION_DATA_AFTER_CLOSE_NOTIFY" in str(lost), lost


async def test_a_busy_hat_drivers_client_does_not_hold_the_close() -> None:
    """hat-drivers' Chatter client against a server without retry results (what Hat peers
    need): the close ends once the conversations read before it are answered."""
    work = Work()
    answered: set[Any] = set()
    warm = asyncio.Event()
    async with rpc.serve(
        "tcp+sbs://127.0.0.1:0", registry=work.registry(), retry_results=False
    ) as server:
        conn = await hat_chatter.connect(net.TcpAddress("127.0.0.1", server.url.port))
        counter = iter(range(1_000_000))

        async def busy() -> None:
            def data() -> hat_chatter.Data:
                return hat_chatter.Data("work", str(next(counter)).encode())

            with contextlib.suppress(ConnectionError):
                for _ in range(IN_FLIGHT):
                    await conn.send(data(), last=False)
                while True:
                    msg = await conn.receive()
                    answered.add(int(msg.data.data))
                    if len(answered) >= WARM:
                        warm.set()
                    await conn.send(data(), last=False)

        running = asyncio.ensure_future(busy())
        try:
            await asyncio.wait_for(warm.wait(), 5)
            took = await work.close(server)
            await asyncio.wait_for(running, 5)
        finally:
            running.cancel()
            await conn.async_close()
    _check(work, answered, took)


async def test_a_busy_websocket_client_gets_the_closing_handshake() -> None:
    """Over WebSocket, a peerwire client the server gives no retry results (as gotalk.js):
    the close frames are exchanged (code 1000 on both sides, neither cut) once the requests
    read before the close are answered; those sent meanwhile fail as the connection
    closes."""
    work = Work()
    answered: set[Any] = set()
    failed: list[str] = []
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=work.registry(), retry_results=False
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False) as client:
            warm = asyncio.Event()
            counter = iter(range(1_000_000))

            async def busy() -> None:
                while True:
                    value = next(counter)
                    try:
                        answered.add(await client.request("work", value, timeout=5))
                    except rpc.ConnectionClosed as exc:
                        failed.append(str(exc))
                        return
                    if len(answered) >= WARM:
                        warm.set()

            running = [asyncio.ensure_future(busy()) for _ in range(IN_FLIGHT)]
            await asyncio.wait_for(warm.wait(), 5)
            [served] = server.peers
            took = await work.close(server)
            await asyncio.wait_for(asyncio.gather(*running), 5)
            await asyncio.wait_for(client.closed, 5)
            assert client.closed.result() is None  # its close frame: 1000
            assert served.closed.result() is None and served.gave_up is not None
    _check(work, answered, took)
    assert len(failed) == IN_FLIGHT


async def test_a_retry_taking_client_still_gets_closing() -> None:
    """A peerwire client (it takes retry results) is still read during the drain, here
    held by one request in flight: what it sends then is refused, "closing", not run.
    (This held before the change too: it guards that peers with retry results keep their
    behaviour.)"""
    work = Work()
    release = asyncio.Event()
    work.hold = release
    first_refusal = asyncio.Event()
    refused: list[str] = []
    answered: set[Any] = set()

    async def seeing(call: rpc.Call, call_next: Any) -> Any:
        try:
            return await call_next(call)
        except rpc.RetryLater as exc:  # seen as it comes, before the close ends
            refused.append(str(exc))
            first_refusal.set()
            raise

    options = rpc.Options(middleware=[seeing])
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=work.registry()) as server:
        async with rpc.connect(str(server.url), reconnect=False, options=options) as client:
            warm = asyncio.Event()
            counter = iter(range(1_000_000))

            async def busy() -> None:
                while True:
                    try:
                        answered.add(await client.request("work", next(counter), timeout=5))
                    except (rpc.RetryLater, rpc.ConnectionClosed):
                        return
                    if len(answered) >= WARM:
                        warm.set()

            running = [asyncio.ensure_future(busy()) for _ in range(IN_FLIGHT)]
            await asyncio.wait_for(warm.wait(), 5)
            held = asyncio.ensure_future(client.request("work", -1, timeout=5))
            await wait_until(lambda: -1 in work.ran)
            closing = asyncio.ensure_future(work.close(server))
            await asyncio.wait_for(first_refusal.wait(), 5)
            release.set()
            answered.add(await asyncio.wait_for(held, 5))
            took = await closing
            await asyncio.wait_for(asyncio.gather(*running), 5)
            await wait_until(lambda: not client.is_open)
    _check(work, answered, took)
    assert refused and all("closing" in text for text in refused), refused

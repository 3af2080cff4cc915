"""The WebSocket transport: Gotalk framing as browser peers need it, the HTTP side (script,
ETag, gzip, static files), origin checks, limits, wss, and one registry on every transport."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import logging
import os
import random
import sys
import threading
from pathlib import Path

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import rpc
from tests.browser import eventually
from tests.certs import Pki, make_server_cert
from tests.rpc_helpers import gotalk_peer_registry
from tests.test_web_hostile import http_request, recorder_server
from transports.stream import client_ssl_context, server_ssl_context
from transports.web_files import Asset, StaticFiles
from transports.websocket import HttpOptions

pytestmark = pytest.mark.both_loops


async def frames(ws, count: int) -> list[bytes]:
    return [await asyncio.wait_for(ws.recv(), 5) for _ in range(count)]


async def test_gotalk_frames_as_browser_peers_need_them() -> None:
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry()
    ) as server:
        uri = server.url.websocket_uri
        origin = f"http://127.0.0.1:{server.url.port}"
        async with ws_connect(uri, origin=origin) as ws:
            assert await frames(ws, 1) == [b"01"]  # the version in a frame of its own
            await ws.send(b"01")
            # header and payload in separate frames (gotalk.js), payload as TEXT
            await ws.send(b"r0001004echo00000007")
            await ws.send('"hello"')
            assert await frames(ws, 2) == [b"R000100000007", b'"hello"']
            # header + payload merged in one frame (non-browser peers)
            await ws.send(b'r0002005greet0000000e{"name":"Bob"}')
            assert await frames(ws, 2) == [b"R000200000018", b'{"greeting":"Hello Bob"}']
            # split mid-header across frames, text frames
            await ws.send("r0003004no")
            await ws.send("pe00000000")
            assert await frames(ws, 2) == [b"E000300000018", b'unknown operation "nope"']
            await ws.send(b"r0004008notifyme00000002")
            await ws.send(b"{}")
            assert await frames(ws, 4) == [b"n004note00000002", b"{}", b"R000400000004", b'"ok"']
            await ws.send(b"s0005006stream00000005")
            await ws.send(b"part1")
            assert await frames(ws, 2) == [b"S000500000005", b"part1"]
            await ws.send(b"p000500000000")
            assert await frames(ws, 1) == [b"S000500000000"]  # empty: no payload frame
            # an unknown message type: f00000002 in its own frame, then close
            await ws.send(b"x000100000000")
            assert await frames(ws, 1) == [b"f00000002"]
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)


@pytest.mark.parametrize("codec", ["gotalk", "sbs"])
async def test_python_client_over_websocket_both_directions(codec: str) -> None:
    client_reg = rpc.Registry()

    @client_reg.handle("whoami")
    def whoami(_value) -> str:
        return "the client"

    query = "?dialect=HatChatter" if codec == "sbs" else ""
    async with rpc.serve(
        f"ws+{codec}://127.0.0.1:0/rpc/", registry=gotalk_peer_registry()
    ) as server:
        async with rpc.connect(f"{server.url}{query}", registry=client_reg) as peer:
            assert await peer.request("greet", {"name": "Web"}) == {"greeting": "Hello Web"}
            results = await asyncio.gather(
                *(peer.request("echo", b"%d" % i, raw=True) for i in range(100))
            )
            assert results == [b"%d" % i for i in range(100)]
            assert [x async for x in peer.stream("stream", parts=["a", "b"])] == ["a", "b"]
            [server_side] = server.peers
            assert await server_side.request("whoami") == "the client"


def http_get(port: int, path: str, headers: dict[str, str] | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


async def test_script_static_files_etag_and_gzip(tmp_path) -> None:
    (tmp_path / "index.html").write_text("<h1>hi</h1>")
    web = HttpOptions(static_dir=tmp_path)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry(), web=web
    ) as srv:
        port = srv.url.port
        get = asyncio.to_thread
        status, headers, body = await get(http_get, port, "/gotalk/gotalk.js")
        assert status == 200 and headers["Cache-Control"] == "public,max-age=300"
        assert "javascript" in headers["Content-Type"] and len(body) > 100
        etag = headers["ETag"]
        status, _, _ = await get(http_get, port, "/gotalk/gotalk.js", {"If-None-Match": etag})
        assert status == 304
        status, headers, zipped = await get(
            http_get, port, "/gotalk/peerwire.js", {"Accept-Encoding": "gzip, deflate"}
        )
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(zipped) == body
        status, _, page = await get(http_get, port, "/")
        assert (status, page) == (200, b"<h1>hi</h1>")
        assert (await get(http_get, port, "/../../etc/passwd"))[0] == 404
        assert (await get(http_get, port, "/nothing-here"))[0] == 404
        assert (await get(http_get, port, "/gotalk/"))[0] == 426  # not an upgrade


async def test_origin_checks() -> None:
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry()
    ) as server:
        uri = server.url.websocket_uri
        for origin in (None, "http://evil.example"):
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(uri, origin=origin):
                    pass
            assert refused.value.response.status_code == 403
            assert b"Forbidden: " in refused.value.response.body
        async with ws_connect(uri, origin=f"http://127.0.0.1:{server.url.port}") as ws:
            assert await frames(ws, 1) == [b"01"]
    allow = HttpOptions(origins=["http://app.example"])
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry(), web=allow
    ) as server:
        async with ws_connect(server.url.websocket_uri, origin="http://app.example") as ws:
            assert await frames(ws, 1) == [b"01"]
        with pytest.raises(InvalidStatus):
            async with ws_connect(
                server.url.websocket_uri, origin=f"http://127.0.0.1:{server.url.port}"
            ):
                pass


async def test_limits_message_size_and_connections() -> None:
    options = rpc.Options(max_size=1000)
    async with rpc.serve(
        "ws+gotalk://127.0.0.1:0/gotalk/",
        registry=gotalk_peer_registry(),
        options=options,
        max_connections=1,
    ) as server:
        origin = f"http://127.0.0.1:{server.url.port}"
        async with ws_connect(server.url.websocket_uri, origin=origin) as ws:
            await frames(ws, 1)
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(server.url.websocket_uri, origin=origin):
                    pass
            assert refused.value.response.status_code == 503
            await ws.send(b"01")
            await ws.send(b"r0001004echo" + b"%08x" % 50_000)  # over max_size: refused
            assert await frames(ws, 1) == [b"f00000002"]
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
        await eventually(lambda: not server.peers, "the refused connection's slot freed")
        async with ws_connect(server.url.websocket_uri, origin=origin) as ws:
            await frames(ws, 1)
            await ws.send(b"x" * 20_000)  # a frame over the WebSocket limit: closed (1009)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_wss(pki: Pki) -> None:
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve(
        "wss+gotalk://127.0.0.1:0/gotalk/", registry=gotalk_peer_registry(), ssl=ctx
    ) as server:
        url = f"wss+gotalk://localhost:{server.url.port}/gotalk/"
        async with rpc.connect(url, ssl=client_ssl_context(cafile=pki.ca)) as peer:
            assert await peer.request("greet", {"name": "TLS"}) == {"greeting": "Hello TLS"}


async def test_wss_server_hostname_names_the_host_the_certificate_is_for(tmp_path: Path) -> None:
    """A wss server reached by IP whose certificate names only peerwire.test: connect checks
    the certificate against ``server_hostname``, as it does for ssl+ URLs."""
    ca, cert, key = make_server_cert(tmp_path, ["peerwire.test"])
    async with rpc.serve(
        "wss+gotalk://127.0.0.1:0/gotalk/",
        registry=gotalk_peer_registry(),
        ssl=server_ssl_context(cert, key),
    ) as server:
        url = f"wss+gotalk://127.0.0.1:{server.url.port}/gotalk/"
        trusted = client_ssl_context(cafile=ca)
        with pytest.raises(rpc.TlsHostnameMismatch):  # checked for the URL's 127.0.0.1
            await rpc.connect(url, ssl=trusted, reconnect=False)
        async with rpc.connect(url, ssl=trusted, server_hostname="peerwire.test") as peer:
            assert await peer.request("greet", {"name": "IP"}) == {"greeting": "Hello IP"}


async def test_one_registry_on_tcp_tls_and_websocket_at_once(pki: Pki) -> None:
    reg = gotalk_peer_registry()
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with (
        rpc.serve("tcp+gotalk://127.0.0.1:0", registry=reg) as tcp,
        rpc.serve("ssl+sbs://127.0.0.1:0", registry=reg, ssl=ctx) as tls,
        rpc.serve("ws+gotalk://127.0.0.1:0/gotalk/", registry=reg) as ws,
    ):
        client_ctx = client_ssl_context(cafile=pki.ca)
        urls = [
            (str(tcp.url), None),
            (f"ssl+sbs://localhost:{tls.url.port}", client_ctx),
            (str(ws.url), None),
        ]
        for url, ssl_ctx in urls:
            async with rpc.connect(url, ssl=ssl_ctx) as peer:
                assert await peer.request("greet", {"name": url[:3]}) == {
                    "greeting": f"Hello {url[:3]}"
                }


async def cached_or_loaded(static: StaticFiles, path: str) -> Asset | None:
    found = static.get(path)
    return await found if isinstance(found, asyncio.Future) else found


async def test_static_files_are_read_gzipped_and_hashed_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "app.js").write_text("console.log('hi');\n" * 100)
    static = StaticFiles(tmp_path, budget=20_000)
    try:
        first = await cached_or_loaded(static, "/app.js")
        assert first is not None and first.gzipped is not None
        assert static.get("/app.js") is first  # the same object: nothing read or zipped again
        assert static.cached_bytes == first.size and static.loads == 1
        (tmp_path / "app.js").write_text("changed\n")
        changed = await cached_or_loaded(static, "/app.js")
        assert changed is not None and changed.body == b"changed\n"  # size/mtime checked
        (tmp_path / "quarter.js").write_text("".join(f"{i:05}" for i in range(1_000)))
        quarter = await cached_or_loaded(static, "/quarter.js")  # a quarter: served, kept
        assert quarter is not None and static.get("/quarter.js") is quarter
        assert static.cached_bytes == changed.size + quarter.size and static.loads == 3
        (tmp_path / "big.js").write_text("x" * 5_001)  # over a quarter: not served at all
        with caplog.at_level(logging.WARNING, logger="peerwire.transports.websocket"):
            assert static.get("/big.js") is None and static.get("/big.js") is None
        assert caplog.text.count("larger than a quarter of static_cache_bytes") == 1
        assert static.get("/../etc/passwd") is None and static.get("/nothing") is None
        assert static.loads == 3
    finally:
        static.close()


class Opens:
    """Files opened under a folder, with the thread that opened each (an audit hook: a
    process keeps its hooks, so one is installed and pointed at each test's folder)."""

    current: Opens | None = None
    installed = False

    def __init__(self, folder: Path) -> None:
        self.prefix = str(folder.resolve()) + "/"
        self.seen: list[tuple[str, int]] = []

    def __enter__(self) -> Opens:
        if not Opens.installed:
            sys.addaudithook(Opens._hook)
            Opens.installed = True
        Opens.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        Opens.current = None

    @staticmethod
    def _hook(event: str, args: tuple[object, ...]) -> None:
        watch = Opens.current
        if event != "open" or watch is None or not isinstance(args[0], str | os.PathLike):
            return
        path = os.fspath(args[0])
        if isinstance(path, str) and path.startswith(watch.prefix):
            watch.seen.append((path.removeprefix(watch.prefix), threading.get_ident()))


async def test_static_files_load_off_the_loop_once_per_request_at_most(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Files that do not all fit the cache, asked for in turn: each request may cost a load
    (read, gzip, SHA-1), in the cache's thread, never on the event loop; a file over a
    quarter of static_cache_bytes is not served; concurrent requests share one load."""
    budget = 400_000
    rng = random.Random(7)
    bodies = {}
    for name in ("a", "b", "c", "d"):  # a quarter of the budget each: two fit, not three
        bodies[name] = bytes(rng.choice(b"0123456789abcdef") for _ in range(budget // 4))
        (tmp_path / f"{name}.txt").write_bytes(bodies[name])
    (tmp_path / "big.txt").write_bytes(b"x" * (budget // 4 + 1))
    http = HttpOptions(static_dir=tmp_path, static_cache_bytes=budget)
    server, _, port = await recorder_server(http=http)
    loop_thread = threading.get_ident()
    try:
        static = server.responder.static
        assert static is not None
        with Opens(tmp_path) as opens, caplog.at_level(logging.WARNING):
            for name in "abcabc":
                reply = await http_request(
                    port, b"GET /%s.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % name.encode()
                )
                assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(bodies[name])
            assert all(thread != loop_thread for _, thread in opens.seen), opens.seen
            assert len(opens.seen) == static.loads == 6  # evicted in turn: one load each
            big = await http_request(port, b"GET /big.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert big.startswith(b"HTTP/1.1 404 ") and len(opens.seen) == 6
            assert caplog.text.count("larger than a quarter of static_cache_bytes") == 1
            get_d = b"GET /d.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            replies = await asyncio.gather(*(http_request(port, get_d) for _ in range(8)))
            assert all(r.startswith(b"HTTP/1.1 200 ") and r.endswith(bodies["d"]) for r in replies)
            assert [name for name, _ in opens.seen[6:]] == ["d.txt"] and static.loads == 7
    finally:
        server.close()
        await server.wait_closed()


def test_the_websockets_api_we_rely_on() -> None:
    """Fails loudly if a websockets upgrade changes the sans-I/O API ws_connection.py uses:
    a client and a server protocol talk to each other in memory, as our transport drives them.
    """
    import websockets
    from websockets.client import ClientProtocol
    from websockets.frames import CloseCode, Frame, Opcode
    from websockets.http11 import Request, Response
    from websockets.protocol import State
    from websockets.server import ServerProtocol
    from websockets.uri import parse_uri

    major = int(websockets.__version__.split(".")[0])
    assert 14 <= major < 18, (
        f"websockets {websockets.__version__} is outside the range pyproject.toml pins and "
        "this test checked; run this test on it, then widen the pin"
    )
    client = ClientProtocol(parse_uri("ws://127.0.0.1:1/gotalk/"), max_size=100)
    server = ServerProtocol(max_size=100)

    def pump(src, dst):
        for chunk in src.data_to_send():
            if chunk:
                dst.receive_data(chunk)
            else:
                dst.receive_eof()
        return dst.events_received()

    request = client.connect()
    client.send_request(request)
    [got] = pump(client, server)
    assert isinstance(got, Request) and got.headers["Host"] == "127.0.0.1:1"
    response = server.accept(got)
    assert isinstance(response, Response) and response.status_code == 101
    server.send_response(response)
    [answer] = pump(server, client)
    assert isinstance(answer, Response) and client.handshake_exc is None
    assert server.state is State.OPEN and client.state is State.OPEN
    client.send_binary(b"header")
    client.send_text(b'"payload"')
    frames = pump(client, server)
    assert [(f.opcode, f.data) for f in frames] == [
        (Opcode.BINARY, b"header"),
        (Opcode.TEXT, b'"payload"'),
    ]
    assert all(type(f) is Frame and f.opcode <= Opcode.BINARY for f in frames)
    server.send_ping(b"1234")
    [ping] = pump(server, client)
    assert ping.opcode is Opcode.PING
    [pong] = pump(client, server)  # the protocol answered by itself
    assert pong.opcode is Opcode.PONG
    client.send_binary(b"x" * 101)  # over max_size: the server fails with 1009
    pump(client, server)
    assert server.close_sent is not None and server.close_sent.code == 1009
    assert server.close_expected()
    refused = ServerProtocol().reject(431, "too large\n")
    assert refused.status_code == 431 and refused.headers["Connection"] == "close"
    assert CloseCode.GOING_AWAY == 1001

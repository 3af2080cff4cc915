"""Real TLS with generated certificates: verification, hostname checks, mutual TLS, and
refusals that say why (on connect, as :class:`rpc.TlsError` subclasses)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator

import pytest

import rpc
from tests.certs import Pki
from tests.rpc_helpers import wait_until
from transports.stream import client_ssl_context, server_ssl_context

SCHEMES = ["ssl+gotalk", "ssl+sbs"]


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("whoami")
    def whoami(_value) -> str:
        peer = rpc.current_peer.get()
        cert = peer.transport.get_extra_info("peercert")  # type: ignore[union-attr]
        if not cert:
            return "anonymous"
        return dict(x[0] for x in cert["subject"])["commonName"]

    return reg


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_verified_tls_request(pki: Pki, scheme: str) -> None:
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        for host in ("127.0.0.1", "localhost"):
            url = f"{scheme}://{host}:{srv.url.port}"
            async with rpc.connect(url, ssl=client_ssl_context(cafile=pki.ca)) as peer:
                assert await peer.request("whoami") == "anonymous"
                tls = peer.transport.get_extra_info("ssl_object")
                assert tls.version() in ("TLSv1.2", "TLSv1.3")


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_untrusted_server_is_refused_by_default(pki: Pki, scheme: str) -> None:
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        url = f"{scheme}://127.0.0.1:{srv.url.port}"
        attempts = [
            {},  # system CAs only: our test CA is not trusted
            {"ssl": client_ssl_context(cafile=pki.other_ca)},
            {"ssl": client_ssl_context(cafile=pki.ca), "server_hostname": "not-the-server.example"},
        ]
        errors = [rpc.TlsUnknownCA, rpc.TlsUnknownCA, rpc.TlsHostnameMismatch]
        for kwargs, error in zip(attempts, errors, strict=True):
            with pytest.raises(error) as refused:
                await rpc.connect(url, **kwargs)
            assert isinstance(refused.value, rpc.ConnectionClosed)  # what callers caught so far
            assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
        assert "not valid for 'not-the-server.example'" in str(refused.value)
        async with rpc.connect(url, ssl=client_ssl_context(verify=False)) as peer:
            assert await peer.request("whoami") == "anonymous"


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_mutual_tls(pki: Pki, scheme: str) -> None:
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key, client_cafile=pki.ca)
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        url = f"{scheme}://localhost:{srv.url.port}"
        with_cert = client_ssl_context(
            cafile=pki.ca, certfile=pki.client_cert, keyfile=pki.client_key
        )
        async with rpc.connect(url, ssl=with_cert) as peer:
            assert await peer.request("whoami") == "client-1"
        # without a client certificate the server refuses us after the TLS 1.3 handshake,
        # without an alert (Python servers send none): connect says so, not the first request
        with pytest.raises(rpc.TlsRejected, match="requires a client certificate"):
            await rpc.connect(url, ssl=client_ssl_context(cafile=pki.ca))


async def test_ssl_contexts_must_match_the_url(pki: Pki) -> None:
    with pytest.raises(ValueError, match="needs an ssl="):
        await rpc.serve("ssl+gotalk://127.0.0.1:0", registry=rpc.Registry()).start()
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    with pytest.raises(ValueError, match="not a TLS URL"):
        await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=rpc.Registry(), ssl=server_ctx)
    with pytest.raises(ValueError, match="not a TLS URL"):
        await rpc.connect("tcp+gotalk://127.0.0.1:1", ssl=client_ssl_context())


@contextlib.contextmanager
def openssl_server(ctx: ssl.SSLContext) -> Iterator[int]:
    """A blocking OpenSSL server in a thread, for one connection: unlike asyncio's and
    uvloop's, it sends its alert when it refuses a client (as Go and C servers do)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def run() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls = ctx.wrap_bio(incoming, outgoing, server_side=True)
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    conn.sendall(outgoing.read())
                    if not (data := conn.recv(65536)):
                        break
                    incoming.write(data)
                except ssl.SSLError:
                    conn.sendall(outgoing.read())  # the alert
                    break
            while conn.recv(65536):  # read what the client sends: closing sends no RST
                pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(15)
        listener.close()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_refusal_alerts_say_why(pki: Pki, scheme: str) -> None:
    requires_ours = server_ssl_context(pki.server_cert, pki.server_key, client_cafile=pki.ca)
    with openssl_server(requires_ours) as port:
        with pytest.raises(rpc.TlsCertificateRequired, match="requires a client certificate"):
            await rpc.connect(f"{scheme}://localhost:{port}", ssl=client_ssl_context(cafile=pki.ca))
    trusts_other = server_ssl_context(pki.server_cert, pki.server_key, client_cafile=pki.other_ca)
    with_cert = client_ssl_context(cafile=pki.ca, certfile=pki.client_cert, keyfile=pki.client_key)
    with openssl_server(trusts_other) as port:
        with pytest.raises(rpc.TlsUnknownCA, match="does not trust the CA of our client"):
            await rpc.connect(f"{scheme}://localhost:{port}", ssl=with_cert)


@pytest.mark.parametrize("scheme", [*SCHEMES, "wss+gotalk"])
async def test_silent_refusal_of_our_certificate_is_raised_on_connect(
    pki: Pki, scheme: str
) -> None:
    """Our own (asyncio) server closes without an alert: connect still says why."""
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key, client_cafile=pki.other_ca)
    with_cert = client_ssl_context(cafile=pki.ca, certfile=pki.client_cert, keyfile=pki.client_key)
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        url = f"{scheme}://localhost:{srv.url.port}{srv.url.path or ''}"
        for ctx in (with_cert, client_ssl_context(cafile=pki.ca)):
            with pytest.raises(rpc.TlsRejected, match="did not accept this client"):
                await rpc.connect(url, ssl=ctx)


@pytest.mark.parametrize("scheme", [*SCHEMES, "wss+gotalk"])
async def test_tls_spoken_to_a_plain_port(pki: Pki, scheme: str) -> None:
    plain = scheme.replace("ssl+", "tcp+").replace("wss+", "ws+")
    async with rpc.serve(f"{plain}://127.0.0.1:0", registry=registry()) as srv:
        url = f"{scheme}://localhost:{srv.url.port}{srv.url.path or ''}"
        with pytest.raises(rpc.TlsNotSpoken, match="not speak TLS on this port"):
            await rpc.connect(url, ssl=client_ssl_context(cafile=pki.ca))
        async with rpc.connect(str(srv.url)) as peer:  # the server lives on
            assert await peer.request("whoami") == "anonymous"


@pytest.mark.parametrize("scheme", ["ssl+gotalk", "wss+gotalk"])
async def test_plain_spoken_to_a_tls_port_fails_on_connect(pki: Pki, scheme: str) -> None:
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    plain = scheme.replace("ssl+", "tcp+").replace("wss+", "ws+")
    async with rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        url = f"{plain}://127.0.0.1:{srv.url.port}{srv.url.path or ''}"
        with pytest.raises(rpc.ConnectionClosed, match="it may expect TLS on this port"):
            await asyncio.wait_for(rpc.connect(url), 10)


async def test_plain_chatter_spoken_to_a_tls_port_fails_on_first_request(pki: Pki) -> None:
    """A plain Chatter client sends nothing until its first request (legacy dialect), so it
    learns only then that the server closed the connection."""
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    async with rpc.serve("ssl+sbs://127.0.0.1:0", registry=registry(), ssl=server_ctx) as srv:
        async with rpc.connect(f"tcp+sbs://127.0.0.1:{srv.url.port}") as peer:
            with pytest.raises(rpc.ConnectionClosed):
                await peer.request("whoami", timeout=5)


@pytest.mark.both_loops
async def test_refused_tls_connections_are_closed_before_any_tls(pki: Pki) -> None:
    """Past max_connections a TLS connection is closed at once, not after a handshake that
    a silent peer would hold for handshake_timeout (the loop's TLS buffers with it)."""
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    options = rpc.Options(handshake_timeout=10)
    async with rpc.serve(
        "ssl+gotalk://127.0.0.1:0",
        registry=registry(),
        ssl=server_ctx,
        options=options,
        max_connections=5,
    ) as srv:
        held = [await asyncio.open_connection("127.0.0.1", srv.url.port) for _ in range(5)]
        await wait_until(lambda: len(srv.peers) == 5)
        async with asyncio.timeout(3):  # far below the 10 s handshake limit
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", srv.url.port)
                with contextlib.suppress(ConnectionResetError):
                    assert await reader.read(100) == b""  # closed, nothing sent: no TLS
                writer.close()
        assert srv.refused == 20
        for _, writer in held:
            writer.close()
        # a peer gone during its handshake frees its place at once, not at the 10 s limit
        await wait_until(lambda: not srv.peers, timeout=5)
        async with rpc.connect(str(srv.url), ssl=client_ssl_context(cafile=pki.ca)) as peer:
            assert await peer.request("whoami") == "anonymous"


def test_server_contexts_refuse_renegotiation(pki: Pki) -> None:
    """TLS 1.2 renegotiation (a peer making the server redo handshakes at will) is off in
    the server contexts we make: OpenSSL 3 refuses a client's by default, 1.1.1 does not.
    Python's ssl has no call that renegotiates, so the context's option is what a test here
    can check (it was not set before)."""
    ctx = server_ssl_context(pki.server_cert, pki.server_key)
    assert ctx.options & ssl.OP_NO_RENEGOTIATION

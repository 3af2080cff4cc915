"""Real TLS with generated certificates: verification, hostname checks, mutual TLS."""

from __future__ import annotations

import ssl

import pytest

import rpc
from tests.certs import Pki
from transports.stream import client_ssl_context, server_ssl_context

SCHEMES = ["ssl+gotalk", "ssl+sbs"]


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("whoami")
    def whoami(_value) -> str:
        peer = rpc.current_peer.get()
        cert = peer._transport.get_extra_info("peercert")  # type: ignore[union-attr]
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
        for kwargs in attempts:
            with pytest.raises(rpc.ConnectionClosed) as refused:
                await rpc.connect(url, **kwargs)
            assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
        assert "match" in str(refused.value.__cause__)
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
        # without a client certificate the server refuses the handshake
        with pytest.raises((rpc.ConnectionClosed, ConnectionError)):
            async with rpc.connect(url, ssl=client_ssl_context(cafile=pki.ca)) as peer:
                await peer.request("whoami", timeout=2)


async def test_ssl_contexts_must_match_the_url(pki: Pki) -> None:
    with pytest.raises(ValueError, match="needs an ssl="):
        await rpc.serve("ssl+gotalk://127.0.0.1:0", registry=rpc.Registry()).start()
    server_ctx = server_ssl_context(pki.server_cert, pki.server_key)
    with pytest.raises(ValueError, match="not a TLS URL"):
        await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=rpc.Registry(), ssl=server_ctx)
    with pytest.raises(ValueError, match="not a TLS URL"):
        await rpc.connect("tcp+gotalk://127.0.0.1:1", ssl=client_ssl_context())
